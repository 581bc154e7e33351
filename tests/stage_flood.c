/* stage_flood.c - a test tool (tests/test_stage_trust.sh): an enrolled
 * device's certificate opening Exchange streams at another device's Stage
 * server and never sending a hello, N at a time, until SIGTERM or SECONDS
 * pass. It prints "flooding" once its N streams were opened the first time,
 * and at the end how the server ended them:
 *   streams=S refused=R timed_out=T other=O
 * (R: refused at the door, FAILED_PRECONDITION or RESOURCE_EXHAUSTED; T:
 * closed for want of a hello, DEADLINE_EXCEEDED).
 *
 *   stage_flood STATE_DIR HOST:PORT PEER_ID N SECONDS */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dev_stagesvc.h"
#include "rpc.h"
#include "sl_log.h"

static rpc_channel *ch;
static atomic_int stop, opened_first;
static atomic_long streams, refused, timed_out, other;

static void *flood(void *arg)
{
    (void)arg;
    int first = 1;
    while (!atomic_load(&stop)) {
        sl_err err = {0};
        rpc_stream *s = rpc_stream_open(ch, RPC_M_STAGE_EXCHANGE, 60000, &err);
        if (first) {
            atomic_fetch_add(&opened_first, 1);
            first = 0;
        }
        if (!s) {
            atomic_fetch_add(&other, 1);
            poll(NULL, 0, 50);
            continue;
        }
        atomic_fetch_add(&streams, 1);
        rpc_buf m;
        if (rpc_stream_recv(s, &m, NULL) == 1) /* the server ends the stream, or never */
            rpc_buf_free(&m);
        rpc_status st;
        int code = rpc_stream_finish(s, &st);
        if (code == RPC_FAILED_PRECONDITION || code == RPC_RESOURCE_EXHAUSTED ||
            code == RPC_PERMISSION_DENIED || code == RPC_UNAUTHENTICATED)
            atomic_fetch_add(&refused, 1);
        else if (code == RPC_DEADLINE_EXCEEDED)
            atomic_fetch_add(&timed_out, 1);
        else
            atomic_fetch_add(&other, 1);
        poll(NULL, 0, 250); /* a flood, but one that leaves the test's job some CPU */
    }
    return NULL;
}

static void on_term(int sig)
{
    (void)sig;
    atomic_store(&stop, 1);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: stage_flood STATE_DIR HOST:PORT PEER_ID N SECONDS\n");
        return 2;
    }
    int n = atoi(argv[4]), seconds = atoi(argv[5]);
    if (n < 1 || n > 1000 || seconds < 1)
        return 2;
    sl_log_set_level(SL_LOG_ERROR);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    rpc_global_init();
    sl_err err = {0};
    if (!(ch = dev_stagesvc_connect(argv[1], argv[2], argv[3], 0, &err))) {
        fprintf(stderr, "stage_flood: %s\n", err.msg);
        return 1;
    }
    pthread_t t;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t, NULL, flood, NULL) == 0)
            pthread_detach(t);
    int said = 0;
    for (time_t end = time(NULL) + seconds; !atomic_load(&stop) && time(NULL) < end;) {
        if (!said && atomic_load(&opened_first) >= n) {
            printf("flooding\n");
            fflush(stdout);
            said = 1;
        }
        poll(NULL, 0, 50);
    }
    printf("streams=%ld refused=%ld timed_out=%ld other=%ld\n", atomic_load(&streams),
           atomic_load(&refused), atomic_load(&timed_out), atomic_load(&other));
    fflush(stdout);
    _exit(0); /* threads may be inside calls: no teardown */
}
