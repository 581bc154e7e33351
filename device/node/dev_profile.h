/* dev_profile.h - what this machine is: hwloc topology and compute backends. */
#ifndef DEV_PROFILE_H
#define DEV_PROFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "sl_err.h"

typedef struct dev_profile {
    unsigned cores;        /* physical cores */
    unsigned pus;          /* hardware threads */
    unsigned numa_nodes;
    uint64_t memory_bytes; /* total memory hwloc sees */
    uint64_t l1d_bytes, l2_bytes, l3_bytes;
    char cpu_model[128];
    bool cuda;             /* a usable GPU */
    char gpu[320];         /* GPU name, or why none */
    uint64_t gpu_memory_bytes;
} dev_profile;

int dev_profile_probe(dev_profile *p, sl_err *err);

#endif
