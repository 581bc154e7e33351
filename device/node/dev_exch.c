/* dev_exch.c - what a device accepts on a Stage Exchange stream (dev_exch.h). */
#include "dev_exch.h"

#include <string.h>

#include "skyloom.pb-c.h"

void dev_exch_hello_pack(uint64_t job, uint32_t epoch, uint32_t from, uint32_t to, rpc_buf *out)
{
    Skyloom__V1__StageHello h = SKYLOOM__V1__STAGE_HELLO__INIT;
    h.job_id = job;
    h.epoch = epoch;
    h.from_stage = from;
    h.to_stage = to;
    Skyloom__V1__StageFrame f = SKYLOOM__V1__STAGE_FRAME__INIT;
    f.hello = &h;
    rpc_pack(&f, out);
}

int dev_exch_hello_parse(const uint8_t *msg, size_t len, dev_exch_hello *h, sl_err *err)
{
    memset(h, 0, sizeof *h);
    Skyloom__V1__StageFrame *f = rpc_unpack(&skyloom__v1__stage_frame__descriptor, msg, len);
    if (!f || !f->hello || f->frame.len) {
        int frame = f && f->frame.len;
        rpc_unpacked_free(f);
        sl_err_set(err, SL_EINVAL, "%s", frame ? "hello: a frame where the hello was due"
                                               : "hello: not a StageFrame with a hello");
        return DEV_EXCH_NOT_HELLO;
    }
    dev_exch_hello x = {.job = f->hello->job_id, .epoch = f->hello->epoch,
                        .from = f->hello->from_stage, .to = f->hello->to_stage};
    rpc_unpacked_free(f);
    /* one encoding only: no unknown or repeated fields, no padded varints */
    rpc_buf again = {0};
    dev_exch_hello_pack(x.job, x.epoch, x.from, x.to, &again);
    int same = again.len == len && !memcmp(again.data, msg, len);
    rpc_buf_free(&again);
    if (!same) {
        sl_err_set(err, SL_EINVAL, "hello: %zu bytes that are not the hello's encoding", len);
        return DEV_EXCH_NOT_HELLO;
    }
    *h = x;
    return DEV_EXCH_OK;
}

int dev_exch_read_hello(rpc_stream *s, int64_t ms, dev_exch_hello *h, sl_err *err)
{
    memset(h, 0, sizeof *h);
    int64_t prev = rpc_stream_set_idle(s, ms);
    rpc_buf b;
    sl_err rerr = {0};
    int r = rpc_stream_recv(s, &b, &rerr);
    rpc_stream_set_idle(s, prev);
    if (r != 1) {
        sl_err_set(err, SL_EIO, "%s", r == 0 ? "the stream ended before its hello"
                                             : "no hello in time (or the stream failed first)");
        return DEV_EXCH_NO_HELLO;
    }
    int bad = dev_exch_hello_parse(b.data, b.len, h, err);
    rpc_buf_free(&b);
    return bad;
}

int dev_exch_is_link(int stages, int a, int b)
{
    if (a < 0 || b >= stages || a >= b)
        return 0;
    return b == a + 1 || (a == 0 && b == stages - 1);
}

static int fed(const dev_net_cfg *c) { return c->replicas >= 2 && c->stage; }

/* The stages of i's chain: first .. first + *n - 1. */
static int chain_of(const dev_net_cfg *c, int i, int *n)
{
    if (!fed(c)) {
        *n = c->stages;
        return 0;
    }
    int first = i, last = i;
    while (first > 0 && c->stage[first - 1].replica == c->stage[i].replica)
        first--;
    while (last + 1 < c->stages && c->stage[last + 1].replica == c->stage[i].replica)
        last++;
    *n = last - first + 1;
    return first;
}

int dev_exch_sync_target(const dev_net_cfg *c, int to, int u, int word)
{
    const dev_net_stage *t = &c->stage[to];
    if (u >= t->first_unit && u <= t->last_unit)
        return 1;
    if (!word || t->last_unit != c->stage[c->stages - 1].last_unit)
        return 0;
    /* the head's tied copy: unless the embeddings are on its device */
    for (int i = 0; i < c->stages; i++)
        if (c->stage[i].first_unit == 0 && !strcmp(c->stage[i].device, t->device))
            return 0;
    return 1;
}

int dev_exch_sync_flow(const dev_net_cfg *c, int from, int to)
{
    if (!fed(c) || from < 0 || to < 0 || from >= c->stages || to >= c->stages ||
        !strcmp(c->stage[from].device, c->stage[to].device))
        return 0;
    const dev_net_stage *f = &c->stage[from];
    for (int u = f->first_unit; u <= f->last_unit; u++)
        if ((c->stage[to].replica != f->replica && dev_exch_sync_target(c, to, u, 0)) ||
            (u == 0 && dev_exch_sync_target(c, to, 0, 1) &&
             !(c->stage[to].first_unit == 0)))
            return 1;
    return 0;
}

int dev_exch_link(const dev_net_cfg *c, int a, int b)
{
    if (a < 0 || b >= c->stages || a >= b)
        return 0;
    int n, first = chain_of(c, a, &n);
    if (b < first + n && dev_exch_is_link(n, a - first, b - first))
        return 1;
    return dev_exch_sync_flow(c, a, b) || dev_exch_sync_flow(c, b, a);
}

int dev_exch_hello_check(const dev_net_cfg *c, const char *peer_id, const dev_exch_hello *h,
                         int *from, int *to, sl_err *err)
{
    *from = *to = -1;
    if (h->job != c->job) {
        sl_err_set(err, SL_EINVAL, "hello: job %016llx, not this net's %016llx",
                   (unsigned long long)h->job, (unsigned long long)c->job);
        return DEV_EXCH_OTHER_JOB;
    }
    if (h->epoch != c->epoch) {
        sl_err_set(err, SL_EINVAL, "hello: epoch %u, not this net's %u", h->epoch, c->epoch);
        return DEV_EXCH_OTHER_EPOCH;
    }
    if (h->from >= (uint32_t)c->stages || h->to >= (uint32_t)c->stages) {
        sl_err_set(err, SL_EINVAL, "hello: stages %u-%u, but the plan has stages 0..%d",
                   h->from, h->to, c->stages - 1);
        return DEV_EXCH_NO_STAGE;
    }
    int a = (int)h->from, b = (int)h->to;
    if (!dev_exch_link(c, a, b)) {
        sl_err_set(err, SL_EINVAL, "hello: stages %d and %d have no link in a pipeline of "
                   "%d stages", a, b, c->stages);
        return DEV_EXCH_NOT_LINK;
    }
    if (strcmp(c->stage[b].device, c->self_id)) {
        sl_err_set(err, SL_EINVAL, "hello: link %d-%d is served by stage %d's device %s, "
                   "not this one", a, b, b, c->stage[b].device);
        return DEV_EXCH_NOT_SERVED;
    }
    if (!strcmp(c->stage[a].device, c->self_id)) {
        sl_err_set(err, SL_EINVAL, "hello: link %d-%d is within this device", a, b);
        return DEV_EXCH_NOT_SERVED;
    }
    if (strcmp(peer_id, c->stage[a].device)) {
        sl_err_set(err, SL_EINVAL, "hello: stage %d is device %s's, not %.40s's", a,
                   c->stage[a].device, peer_id);
        return DEV_EXCH_WRONG_PEER;
    }
    *from = a;
    *to = b;
    return DEV_EXCH_OK;
}

int dev_exch_refusal_code(int refusal)
{
    switch (refusal) {
    case DEV_EXCH_OK: return RPC_OK;
    case DEV_EXCH_WRONG_PEER: return RPC_PERMISSION_DENIED;
    case DEV_EXCH_OTHER_JOB:
    case DEV_EXCH_OTHER_EPOCH:
    case DEV_EXCH_NOT_SERVED: return RPC_FAILED_PRECONDITION;
    case DEV_EXCH_NO_HELLO: return RPC_DEADLINE_EXCEEDED;
    default: return RPC_INVALID_ARGUMENT;
    }
}

int dev_exch_allowed_in(const dev_net_cfg *c, int a, int b, int down, int dir)
{
    if (dir == DEV_DIR_SYNC)
        return a < b && (down ? dev_exch_sync_flow(c, a, b) : dev_exch_sync_flow(c, b, a));
    int n, first = chain_of(c, a >= 0 && a < c->stages ? a : 0, &n);
    if (a < first || b >= first + n)
        return 0;
    return dev_exch_allowed(n, a - first, b - first, down, dir);
}

int dev_exch_allowed(int stages, int a, int b, int down, int dir)
{
    if (!dev_exch_is_link(stages, a, b))
        return 0;
    int chain = b == a + 1, side = a == 0 && b == stages - 1;
    switch (dir) {
    case DEV_DIR_ACTIVATION:
    case DEV_DIR_MASK:
    case DEV_DIR_GATHER: return chain && down;
    case DEV_DIR_GRADIENT:
    case DEV_DIR_GATHER_RESULT: return chain && !down;
    case DEV_DIR_LABELS: return side && down;
    case DEV_DIR_TIED: return side;
    default: return 0;
    }
}

static const char *dir_name(int dir)
{
    static const char *const names[] = {"?", "activation", "gradient", "mask", "labels",
                                        "tied gradient", "gather", "gather result", "abort",
                                        "sync"};
    return dir >= 1 && dir <= DEV_DIR_SYNC ? names[dir] : names[0];
}

int dev_exch_frame(int stages, int a, int b, int down, const uint8_t *msg, size_t len,
                   const uint8_t **frame, size_t *n, dev_frame_hdr *h, sl_err *err)
{
    dev_net_cfg c = {.stages = stages};
    return dev_exch_frame_in(&c, a, b, down, msg, len, frame, n, h, err);
}

int dev_exch_frame_in(const dev_net_cfg *c, int a, int b, int down, const uint8_t *msg, size_t len,
                      const uint8_t **frame, size_t *n, dev_frame_hdr *h, sl_err *err)
{
    *frame = NULL;
    *n = 0;
    memset(h, 0, sizeof *h);
    const uint8_t *fr;
    size_t fl;
    if (rpc_frame_unwrap(msg, len, &fr, &fl)) {
        sl_err_set(err, SL_EINVAL, "not a StageFrame holding a frame alone");
        return DEV_FR_BAD_HEADER;
    }
    int why = DEV_FR_OK;
    dev_frame_hdr x;
    if (dev_frame_parse_header(fr, fl, 0, &x, &why, err))
        return why == DEV_FR_OK ? DEV_FR_BAD_HEADER : why;
    int from = down ? a : b, to = down ? b : a;
    if (x.from_stage != from || x.to_stage != to) {
        sl_err_set(err, SL_EINVAL, "a frame from stage %u to %u on the flow from %d to %d",
                   x.from_stage, x.to_stage, from, to);
        return DEV_FR_MISROUTED;
    }
    if (!dev_exch_allowed_in(c, a, b, down, x.direction)) {
        sl_err_set(err, SL_EINVAL, "a frame of kind %s (direction %u) %s link %d-%d",
                   dir_name(x.direction), x.direction, down ? "down" : "up", a, b);
        return DEV_FR_BAD_HEADER;
    }
    *frame = fr;
    *n = fl;
    *h = x;
    return DEV_FR_OK;
}
