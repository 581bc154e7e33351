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

/* The cores this process computes on, as the balancer models them
 * (bal_device.cpu_pool): processes naming the same pool share its cores. */
typedef struct dev_cpu_pool {
    char name[48];    /* "m-" and /etc/machine-id, or "h-" and the host name */
    double pool_cpus; /* CPUs online on the machine */
    double cpus;      /* what this process can use: its threads, its CPU affinity, its cgroup's quota */
    char net_ns[48];  /* its network namespace ("net:[INODE]"; "" if unknown) */
    int quota_unknown; /* its cgroup is not mounted where it runs (another sysfs over /sys, as
                        * `ip netns exec` mounts): a quota there is not in cpus (logged) */
} dev_cpu_pool;

void dev_cpu_pool_probe(dev_cpu_pool *p, int threads);

/* The machine to oneself among the processes that take this lock (the
 * devices of this machine, while they time their units; a flock on
 * /etc/machine-id, or on the executable where there is none): a descriptor
 * to pass to dev_machine_unlock, or -1 if it was not free within timeout_s
 * or cannot be taken here. */
int dev_machine_lock(double timeout_s);
void dev_machine_unlock(int fd);

#endif
