/* skyloom profile: this machine's topology and compute backends. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dev_profile.h"

int cmd_profile(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: skyloom profile [--json]\n\n"
                   "Shows what hwloc and the CUDA runtime report about this machine: cores,\n"
                   "hardware threads, memory, caches and GPUs. Devices send this profile to the\n"
                   "coordinator when they enroll. Also the cores this process may use (its CPU\n"
                   "affinity and cgroup quota, as a device reports them for each job).\n");
            return 0;
        } else
            return sl_cli_fail("profile", 2, "unknown option '%s'", argv[i]);
    }
    dev_profile p;
    sl_err err = {0};
    if (dev_profile_probe(&p, &err))
        return sl_cli_fail("profile", 1, "%s", err.msg);
    dev_cpu_pool pool;
    dev_cpu_pool_probe(&pool, 1 << 20); /* no thread cap: the process's own limits */
    if (json) {
        json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:s, s:I}",
                              "cpu_model", p.cpu_model, "cores", (json_int_t)p.cores, "pus",
                              (json_int_t)p.pus, "numa_nodes", (json_int_t)p.numa_nodes,
                              "memory_bytes", (json_int_t)p.memory_bytes, "l1d_bytes",
                              (json_int_t)p.l1d_bytes, "l2_bytes", (json_int_t)p.l2_bytes,
                              "l3_bytes", (json_int_t)p.l3_bytes, "cuda", p.cuda, "gpu", p.gpu,
                              "gpu_memory_bytes", (json_int_t)p.gpu_memory_bytes);
        json_object_set_new(o, "cpu_pool",
                            json_pack("{s:s, s:f, s:f, s:s, s:b}", "name", pool.name, "pool_cpus",
                                      pool.pool_cpus, "cpus", pool.cpus, "net_ns", pool.net_ns,
                                      "quota_known", !pool.quota_unknown));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
        printf("%s\n", s);
        free(s);
        json_decref(o);
        return 0;
    }
    printf("cpu:      %s\n", p.cpu_model);
    printf("cores:    %u physical, %u hardware threads, %u NUMA node(s)\n", p.cores, p.pus,
           p.numa_nodes);
    printf("memory:   %.1f GiB\n", (double)p.memory_bytes / (1u << 30));
    printf("caches:   L1d %llu KiB, L2 %llu KiB, L3 %llu KiB\n",
           (unsigned long long)p.l1d_bytes >> 10, (unsigned long long)p.l2_bytes >> 10,
           (unsigned long long)p.l3_bytes >> 10);
    printf("gpu:      %s\n", p.cuda ? p.gpu : "none");
    if (!p.cuda)
        printf("          %s\n", p.gpu);
    printf("cpus:     this process may use %g of the %g online (cpu pool %s)%s\n", pool.cpus,
           pool.pool_cpus, pool.name,
           pool.quota_unknown ? "; a cgroup quota is unknown: its cgroup is not mounted here" : "");
    return 0;
}
