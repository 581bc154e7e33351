/* coord_call.h - the one way into the job manager's calls (coord_jobs_rpc.c,
 * coord_jobs_files.c): a handler is a body run by coord_call_serve, which
 * unpacks the request, authorizes the caller for the device it speaks for,
 * finds the job it names and checks the caller's role in that job before
 * the body runs. A body changes the job only through its state machine's
 * events, under the manager's lock, and settles their effects after it. */
#ifndef COORD_CALL_H
#define COORD_CALL_H

#include "coord_jobs_int.h"
#include "rpc.h"

typedef struct call {
    coord *c;
    coord_jobs *j;
    const rpc_peer *peer;
    void *req;
    const char *device; /* the device the request speaks for ("" the admin) */
    const char *job_id;
    cjob *jb;           /* the job it names, when found */
    rpc_buf *resp;
    rpc_status *st;
} call;

typedef struct method {
    const char *name;
    const ProtobufCMessageDescriptor *desc;
    int allow;        /* COORD_ALLOW_* */
    int need_job;     /* a job_id that is no job: NOT_FOUND before the body runs */
    int roles;        /* a device caller must be one of these to its job (COORD_MEMBER_*) */
    int (*body)(call *k);
} method;

int coord_call_serve(const method *m, void *ud, const rpc_peer *peer, const uint8_t *req,
                     size_t len, rpc_buf *resp, rpc_status *st);
/* Packs msg as the call's answer. */
int coord_call_reply(call *k, const void *msg);
/* Applies an event's effects: queued under j->mu (held on entry), run
 * after releasing it. */
void coord_call_settle(coord_jobs *j, cjob *jb, coord_fx_list *fx);
/* "a/b", allocated. */
char *coord_path_of(const char *a, const char *b);

#define HANDLER(fn, type, desc, allow, need_job, roles, body)                                    \
    int fn(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len, rpc_buf *resp,          \
           rpc_status *st)                                                                         \
    {                                                                                              \
        static const method m = {type, &desc, allow, need_job, roles, body};                       \
        return coord_call_serve(&m, ud, peer, req, len, resp, st);                                            \
    }

#endif
