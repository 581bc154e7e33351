/* skyloom version: what this build and this machine have, told truthfully. */
#include <getopt.h>
#include <hwloc.h>
#include <openssl/crypto.h>
#include <sodium.h>
#include <microhttpd.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kn_backend.h"
#include "rpc.h"
#include "sl_config.h"

int cmd_version(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: skyloom version\n\n"
                   "Prints the version, the libraries linked in, and the compute backends this\n"
                   "build has and this machine can use (same as skyloom --version).\n");
            return 0;
        }
        return sl_cli_fail("version", 2, "unknown option '%s'", argv[i]);
    }
    const kn_cuda_info *cuda = kn_cuda_probe();
    unsigned hw = hwloc_get_api_version();
    printf("skyloom %s\n", SKYLOOM_VERSION);
    printf("  cpu blas:  %s, %d threads\n", kn_blas_name(), kn_blas_threads());
    sl_err err = {0};
    int bf16 = kn_cpu_bf16_check(&err);
    printf("  cpu bf16:  oneDNN %s, %s: %s\n", kn_dnnl_version(), kn_dnnl_isa(),
           bf16 ? err.msg : "--precision bf16 available");
    printf("  cuda:      %s\n", cuda->compiled ? "compiled in" : "not compiled in");
    if (cuda->compiled)
        printf("  gpu:       %s\n", cuda->device_count > 0 ? cuda->reason : "none found");
    if (cuda->compiled && cuda->device_count <= 0)
        printf("             %s\n", cuda->reason);
    printf("  grpc core: %s\n", rpc_grpc_version());
    printf("  openssl:   %s\n", OpenSSL_version(OPENSSL_VERSION));
    printf("  libsodium: %s\n", sodium_version_string());
    printf("  sqlite:    %s\n", sqlite3_libversion());
    printf("  http:      libmicrohttpd %s\n", MHD_get_version());
    printf("  hwloc:     %u.%u.%u\n", hw >> 16, (hw >> 8) & 0xff, hw & 0xff);
    return 0;
}
