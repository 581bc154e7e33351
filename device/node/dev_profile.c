#include "dev_profile.h"

#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "kn_backend.h"

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
