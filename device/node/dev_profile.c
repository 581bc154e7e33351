#include "dev_profile.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kn_backend.h"
#include "sl_log.h"
#include "sl_time.h"

#define MACHINE_ID "/etc/machine-id"

static uint64_t cache_size(hwloc_topology_t t, hwloc_obj_type_t type)
{
    hwloc_obj_t o = hwloc_get_obj_by_type(t, type, 0);
    return o && o->attr ? o->attr->cache.size : 0;
}

int dev_profile_probe(dev_profile *p, sl_err *err)
{
    memset(p, 0, sizeof *p);
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0)
        return sl_err_set(err, SL_EINTERNAL, "hwloc_topology_init failed");
    if (hwloc_topology_load(t) != 0) {
        hwloc_topology_destroy(t);
        return sl_err_set(err, SL_EINTERNAL, "hwloc_topology_load failed");
    }
    int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
    p->cores = n > 0 ? (unsigned)n : 0;
    n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
    p->pus = n > 0 ? (unsigned)n : 0;
    n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    p->numa_nodes = n > 0 ? (unsigned)n : 1;
    hwloc_obj_t root = hwloc_get_root_obj(t);
    p->memory_bytes = root->total_memory;
    p->l1d_bytes = cache_size(t, HWLOC_OBJ_L1CACHE);
    p->l2_bytes = cache_size(t, HWLOC_OBJ_L2CACHE);
    p->l3_bytes = cache_size(t, HWLOC_OBJ_L3CACHE);
    hwloc_obj_t pkg = hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, 0);
    const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
    snprintf(p->cpu_model, sizeof p->cpu_model, "%s", model ? model : "unknown");
    hwloc_topology_destroy(t);

    const kn_cuda_info *ci = kn_cuda_probe();
    p->cuda = ci->device_count > 0;
    snprintf(p->gpu, sizeof p->gpu, "%s", ci->reason);
    p->gpu_memory_bytes = ci->memory_bytes;
    if (p->cores == 0)
        return sl_err_set(err, SL_EINTERNAL, "hwloc found no cores");
    return 0;
}

/* The first line of a small file, trimmed; "" if it cannot be read. */
static void first_line(const char *path, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (!fgets(buf, (int)n, f))
        buf[0] = 0;
    fclose(f);
    size_t k = strlen(buf);
    while (k && isspace((unsigned char)buf[k - 1]))
        buf[--k] = 0;
}

/* The quota in cores of the cgroup at root + path and of every cgroup above
 * it (the smallest; 0 where none is set): cgroup v2's cpu.max ("QUOTA
 * PERIOD" or "max PERIOD"), or v1's cpu.cfs_quota_us and cpu.cfs_period_us
 * (-1: none). */
static double quota_walk(const char *root, const char *path, int v1)
{
    char dir[1024], file[1100], v[128];
    double best = 0;
    size_t rl = strlen(root);
    if (snprintf(dir, sizeof dir, "%s%s", root, path) >= (int)sizeof dir)
        return 0;
    for (;;) {
        double quota = 0, period = 0;
        if (v1) {
            snprintf(file, sizeof file, "%s/cpu.cfs_quota_us", dir);
            first_line(file, v, sizeof v);
            quota = v[0] ? strtod(v, NULL) : 0;
            snprintf(file, sizeof file, "%s/cpu.cfs_period_us", dir);
            first_line(file, v, sizeof v);
            period = v[0] ? strtod(v, NULL) : 0;
        } else {
            snprintf(file, sizeof file, "%s/cpu.max", dir);
            first_line(file, v, sizeof v);
            char *end = NULL;
            quota = v[0] && strncmp(v, "max", 3) ? strtod(v, &end) : 0;
            period = end && end != v ? strtod(end, NULL) : 0;
        }
        if (quota > 0 && period > 0 && (best == 0 || quota / period < best))
            best = quota / period;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < rl)
            break;
        *slash = 0;
    }
    return best;
}

static int is_dir(const char *root, const char *path)
{
    char dir[1100];
    struct stat st;
    return snprintf(dir, sizeof dir, "%s%s", root, path) < (int)sizeof dir && stat(dir, &st) == 0 &&
           S_ISDIR(st.st_mode);
}

/* The CPU quota of this process in cores, 0 where none is set: the cgroup v2
 * hierarchy (at /sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1) and the
 * v1 cpu controller, whichever limits more. A hierarchy /proc/self/cgroup
 * names but this mount namespace does not show (`ip netns exec` mounts a
 * sysfs of its own over /sys) goes to `missing`, its quota unknown. */
static double cgroup_quota(char *missing, size_t mn)
{
    char line[1024];
    missing[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return 0;
    double best = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/')
            continue;
        *c2 = 0;
        const char *ctrl = c1 + 1, *path = c2 + 1;
        double q[2] = {0, 0};
        if (!*ctrl) {
            q[0] = quota_walk("/sys/fs/cgroup", path, 0);
            q[1] = quota_walk("/sys/fs/cgroup/unified", path, 0);
            if (!is_dir("/sys/fs/cgroup", path) && !is_dir("/sys/fs/cgroup/unified", path))
                snprintf(missing, mn, "/sys/fs/cgroup%s", path);
        } else {
            char list[256], *save = NULL;
            snprintf(list, sizeof list, "%s", ctrl);
            for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
                if (!strcmp(t, "cpu")) {
                    char root[300];
                    snprintf(root, sizeof root, "/sys/fs/cgroup/%s", ctrl);
                    q[0] = quota_walk(root, path, 1);
                    q[1] = quota_walk("/sys/fs/cgroup/cpu", path, 1);
                    if (!is_dir(root, path) && !is_dir("/sys/fs/cgroup/cpu", path))
                        snprintf(missing, mn, "%s%s", root, path);
                }
        }
        for (int i = 0; i < 2; i++)
            if (q[i] > 0 && (best == 0 || q[i] < best))
                best = q[i];
    }
    fclose(f);
    return best;
}

void dev_cpu_pool_probe(dev_cpu_pool *p, int threads)
{
    memset(p, 0, sizeof *p);
    char id[64];
    first_line(MACHINE_ID, id, sizeof id);
    int hex = id[0] != 0;
    for (const char *c = id; *c; c++)
        hex &= isxdigit((unsigned char)*c) != 0;
    if (hex)
        snprintf(p->name, sizeof p->name, "m-%.40s", id);
    else if (gethostname(id, sizeof id) == 0 && (id[sizeof id - 1] = 0, id[0]))
        snprintf(p->name, sizeof p->name, "h-%.40s", id);
    else
        snprintf(p->name, sizeof p->name, "h-unknown");
    for (char *c = p->name; *c; c++)
        if (iscntrl((unsigned char)*c))
            *c = '?';
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    p->pool_cpus = online > 0 ? (double)online : 1;
    double cpus = threads > 0 ? threads : 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 && CPU_COUNT(&set) < cpus)
        cpus = CPU_COUNT(&set);
    char missing[1100];
    double quota = cgroup_quota(missing, sizeof missing);
    if (quota > 0 && quota < cpus)
        cpus = quota;
    p->quota_unknown = missing[0] != 0;
    if (missing[0])
        sl_log_warn("device: cannot read its cgroup, so a CPU quota set there is unknown to the "
                    "plan (ip netns exec mounts a sysfs of its own over /sys; nsenter "
                    "--net=/run/netns/NAME keeps the cgroup filesystem)",
                    "cgroup=\"%s\" cpus=%g", missing, cpus);
    p->cpus = cpus < p->pool_cpus ? cpus : p->pool_cpus;
    ssize_t n = readlink("/proc/self/ns/net", p->net_ns, sizeof p->net_ns - 1);
    p->net_ns[n > 0 ? n : 0] = 0;
}

/* flock on /etc/machine-id: every process of the machine can open it, and
 * it needs no file of our own left behind. */
int dev_machine_lock(double timeout_s)
{
    int fd = open(MACHINE_ID, O_RDONLY | O_CLOEXEC);
    if (fd < 0) /* no machine id: the devices of this executable take turns */
        fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    double deadline = sl_now_s() + timeout_s;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return fd;
        if ((errno != EWOULDBLOCK && errno != EINTR) || sl_now_s() >= deadline)
            break;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    close(fd);
    return -1;
}

void dev_machine_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}
