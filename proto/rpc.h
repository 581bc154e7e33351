/* rpc.h - the one layer that touches the gRPC C core API (rpc_ prefix). */
#ifndef RPC_H
#define RPC_H

/* grpc_init(); call once before any other rpc_ function. */
void rpc_global_init(void);
/* grpc_shutdown(); call last, after every call, channel and server is gone. */
void rpc_global_shutdown(void);
/* The gRPC core version string ("29.0.0" on Debian 12's 1.51). */
const char *rpc_grpc_version(void);

#endif
