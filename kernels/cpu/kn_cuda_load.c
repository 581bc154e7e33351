/* CUDA on demand: kn_cuda_probe, kn_cuda_selftest and kn_be_cuda without
 * linking the CUDA runtime or cuBLAS.
 *
 * A CUDA build puts everything that needs them into the module
 * libskyloom_cuda.so (kn_cuda.h). The first probe here checks for the NVIDIA
 * driver (libcuda.so.1) and only then opens the module, so a CPU machine
 * running a CUDA build never maps cuBLAS. The module is looked for in order:
 * $SKYLOOM_CUDA_MODULE, the build tree, the install libdir, then the dynamic
 * linker's search path. SKYLOOM_CUDA_FORCE_LOAD=1 skips the driver check
 * (tests use it to load the module on machines without a GPU). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_backend.h"
#include "kn_be.h"
#include "sl_config.h"
#if HAVE_CUDA
#include "kn_cuda.h"
#endif

static kn_cuda_info g_info;
static const kn_be *g_be;
static int (*g_selftest)(char *reason, size_t n);
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if HAVE_CUDA
static void *open_module(char *why, size_t n)
{
    const char *env = getenv("SKYLOOM_CUDA_MODULE");
    const char *paths[] = {env && *env ? env : NULL, SKYLOOM_CUDA_MODULE_BUILD,
                           SKYLOOM_CUDA_MODULE_INSTALL, "libskyloom_cuda.so"};
    why[0] = 0;
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (!paths[i])
            continue;
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        const char *e = dlerror();
        if (!why[0] || env) /* the first failure says most (or the one asked for) */
            snprintf(why, n, "%s", e ? e : paths[i]);
        if (env)
            break;
    }
    return NULL;
}
#endif

static void load_once(void)
{
#if HAVE_CUDA
    g_info.compiled = true;
    g_info.status = -1;
    const char *force = getenv("SKYLOOM_CUDA_FORCE_LOAD");
    if (!(force && !strcmp(force, "1"))) {
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!drv) {
            const char *e = dlerror();
            snprintf(g_info.reason, sizeof g_info.reason,
                     "CUDA driver missing: libcuda.so.1 not loadable (%s)", e ? e : "?");
            return;
        }
        dlclose(drv);
    }
    char why[256];
    void *h = open_module(why, sizeof why);
    if (!h) {
        snprintf(g_info.reason, sizeof g_info.reason, "CUDA module not loadable: %s", why);
        return;
    }
    const kn_cuda_module *(*entry)(void) = NULL;
    *(void **)&entry = dlsym(h, "skyloom_cuda_module");
    const kn_cuda_module *m = entry ? entry() : NULL;
    if (!m || m->abi != KN_CUDA_MODULE_ABI) {
        snprintf(g_info.reason, sizeof g_info.reason,
                 "CUDA module is not this build's (no entry point or ABI %d, expected %d)",
                 m ? m->abi : -1, KN_CUDA_MODULE_ABI);
        dlclose(h);
        return;
    }
    g_info = *m->probe(); /* the module stays loaded for the process's life */
    g_selftest = m->selftest;
    g_be = m->be;
#else
    g_info.compiled = false;
    g_info.status = -1;
    snprintf(g_info.reason, sizeof g_info.reason,
             "CUDA not compiled in (build with -Dcuda=enabled and nvcc on PATH)");
#endif
}

const kn_cuda_info *kn_cuda_probe(void)
{
    pthread_once(&g_once, load_once);
    return &g_info;
}

int kn_cuda_selftest(char *reason, size_t n)
{
    const kn_cuda_info *ci = kn_cuda_probe();
    if (ci->device_count <= 0 || !g_selftest) {
        snprintf(reason, n, "%s", ci->reason);
        return -1;
    }
    return g_selftest(reason, n);
}

const kn_be *kn_be_cuda(void)
{
    kn_cuda_probe();
    return g_be;
}
