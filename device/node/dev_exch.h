/* dev_exch.h - what a device accepts on a Stage Exchange stream, without
 * threads or sockets: dev_net and dev_jobs decide with these.
 *
 * A net of p stages has the chain links i-(i+1) and, when p > 2, the side
 * link 0-(p-1) (with p = 2 the chain link is the side link too). The device
 * of stage a opens link a-b and sends the hello (job, epoch, a, b); the
 * device of stage b serves it, unless it holds stage a as well (a local
 * link). Every later message is a StageFrame holding a frame alone.
 *
 * What each flow of a link may carry (down: a to b, up: b to a):
 *   chain link   down: activation, mask, gather     up: gradient, gather result
 *   side link    down: labels, tied gradient        up: tied gradient
 *
 * In a federation (dev_net.h) chain and side links are within each
 * replica's chain (its own stages numbered from its first), and a flow
 * from stage a to stage b carries sync payloads when dev_exch_sync_flow
 * says so (a link of its own between stages of different replicas, or the
 * side link of one replica whose head is not on its embeddings' device). */
#ifndef DEV_EXCH_H
#define DEV_EXCH_H

#include <stddef.h>
#include <stdint.h>

#include "dev_frame.h"
#include "dev_net.h"
#include "rpc.h"
#include "sl_err.h"

typedef struct dev_exch_hello {
    uint64_t job;
    uint32_t epoch;
    uint32_t from, to;     /* stage indexes as sent */
} dev_exch_hello;

/* Why a hello is refused. */
enum dev_exch_refusal {
    DEV_EXCH_OK = 0,
    DEV_EXCH_NOT_HELLO,    /* not a StageFrame holding a hello alone, as hello_pack writes it */
    DEV_EXCH_OTHER_JOB,
    DEV_EXCH_OTHER_EPOCH,
    DEV_EXCH_NO_STAGE,     /* a stage index the plan does not have */
    DEV_EXCH_NOT_LINK,     /* two stages without a link between them */
    DEV_EXCH_NOT_SERVED,   /* a link of the net that this device does not serve */
    DEV_EXCH_WRONG_PEER,   /* the caller is not the device of the link's first stage */
    DEV_EXCH_NO_HELLO,     /* the stream sent nothing in time, or ended first */
};

/* How long a caller has to send its hello once its stream is open. */
#define DEV_EXCH_HELLO_MS 5000

/* The StageFrame holding the hello of link from-to (to out; caller frees). */
void dev_exch_hello_pack(uint64_t job, uint32_t epoch, uint32_t from, uint32_t to, rpc_buf *out);
/* Reads a hello: the message must be exactly what dev_exch_hello_pack writes
 * for its fields. DEV_EXCH_OK, or DEV_EXCH_NOT_HELLO with the reason in err. */
int dev_exch_hello_parse(const uint8_t *msg, size_t len, dev_exch_hello *h, sl_err *err);
/* Reads a stream's first message as a hello, waiting at most ms for it (the
 * stream's idle limit is ms meanwhile, then what it was; a stream that
 * sends nothing in time is cancelled). DEV_EXCH_OK with *h, DEV_EXCH_NO_HELLO
 * or DEV_EXCH_NOT_HELLO with the reason in err. */
int dev_exch_read_hello(rpc_stream *s, int64_t ms, dev_exch_hello *h, sl_err *err);
/* Whether this device (c->self_id) serves the link h names for the caller
 * peer_id: DEV_EXCH_OK with the link's stages in *from and *to, or a
 * refusal with the reason in err. */
int dev_exch_hello_check(const dev_net_cfg *c, const char *peer_id, const dev_exch_hello *h,
                         int *from, int *to, sl_err *err);
/* The gRPC status code a refusal is answered with (the client tries again
 * on RPC_FAILED_PRECONDITION: the other end may not run the epoch yet). */
int dev_exch_refusal_code(int refusal);

/* 1 if a net of `stages` stages (one chain) has the link a-b. */
int dev_exch_is_link(int stages, int a, int b);
/* 1 if the net c has the link a-b (a < b): a link of a replica's chain, or
 * a sync link. */
int dev_exch_link(const dev_net_cfg *c, int a, int b);
/* 1 if in the federation c stage `from` gives a tensor that stage `to`
 * receives for its device: they are on different devices and `to` holds
 * the tensor's unit (the word embeddings: `to` holds unit 0, or the head
 * when no stage of its device holds unit 0). */
int dev_exch_sync_flow(const dev_net_cfg *c, int from, int to);
/* Whether stage `to` receives, for its device, a tensor of unit u (word:
 * the word embeddings, which the head's tied copy holds too). */
int dev_exch_sync_target(const dev_net_cfg *c, int to, int u, int word);
/* 1 if a frame of direction dir (enum dev_direction) may come over link a-b
 * of a net of `stages` stages, downstream (down) or upstream. */
int dev_exch_allowed(int stages, int a, int b, int down, int dir);
/* The same in the net c (a federation's chains and sync links). */
int dev_exch_allowed_in(const dev_net_cfg *c, int a, int b, int down, int dir);
/* Checks a message received on link a-b after the hello: a StageFrame with
 * its frame alone, a frame header that parses (dev_frame_parse_header; not
 * authenticated), naming this flow's stages, of a direction the flow may
 * carry. DEV_FR_OK with the frame (inside msg) and its header, or the
 * refusal's DEV_FR_* reason with the why in err. */
int dev_exch_frame(int stages, int a, int b, int down, const uint8_t *msg, size_t len,
                   const uint8_t **frame, size_t *n, dev_frame_hdr *h, sl_err *err);
/* The same in the net c. */
int dev_exch_frame_in(const dev_net_cfg *c, int a, int b, int down, const uint8_t *msg, size_t len,
                      const uint8_t **frame, size_t *n, dev_frame_hdr *h, sl_err *err);

#endif
