#include "rpc.h"

#include <grpc/grpc.h>

void rpc_global_init(void) { grpc_init(); }
void rpc_global_shutdown(void) { grpc_shutdown(); }
const char *rpc_grpc_version(void) { return grpc_version_string(); }
