/* test_dev_exch.c - what a device accepts on a Stage Exchange stream
 * (dev_exch.h), on the net of fuzz/fuzz_exchange.h: the hellos of the links
 * it serves, each refusal with its message and status code, and which
 * frames each flow takes. */
#include <string.h>

#include "dev_exch.h"
#include "fuzz/fuzz_exchange.h"
#include "rpc.h"
#include "sl_log.h"
#include "sl_test.h"

static dev_net_cfg cfg;

/* dev_exch_hello_check of a packed hello, as the server reads it. */
static int hello(uint64_t job, uint32_t epoch, uint32_t from, uint32_t to, const char *peer,
                 sl_err *err)
{
    rpc_buf m = {0};
    dev_exch_hello_pack(job, epoch, from, to, &m);
    dev_exch_hello h;
    int r = dev_exch_hello_parse(m.data, m.len, &h, err);
    rpc_buf_free(&m);
    if (r)
        return r;
    int a, b;
    r = dev_exch_hello_check(&cfg, peer, &h, &a, &b, err);
    if (r == DEV_EXCH_OK && (a != (int)from || b != (int)to))
        return -1;
    return r;
}

static void test_hellos_accepted(void)
{
    sl_err err = {0};
    CHECKF(hello(FX_JOB, FX_EPOCH, 0, 1, FX_A, &err) == DEV_EXCH_OK, "%s", err.msg);
    CHECKF(hello(FX_JOB, FX_EPOCH, 3, 4, FX_C, &err) == DEV_EXCH_OK, "%s", err.msg);
    CHECKF(hello(FX_JOB, FX_EPOCH, 0, 4, FX_A, &err) == DEV_EXCH_OK, "%s", err.msg);
}

static void test_hello_refusals(void)
{
    struct {
        uint64_t job;
        uint32_t epoch, from, to;
        const char *peer;
        int refusal, code;
        const char *msg;
    } cases[] = {
        {FX_JOB + 1, FX_EPOCH, 0, 1, FX_A, DEV_EXCH_OTHER_JOB, RPC_FAILED_PRECONDITION,
         "hello: job 1234abcd5678ef02, not this net's 1234abcd5678ef01"},
        {FX_JOB, 4, 0, 1, FX_A, DEV_EXCH_OTHER_EPOCH, RPC_FAILED_PRECONDITION,
         "hello: epoch 4, not this net's 3"},
        {FX_JOB, FX_EPOCH, 0, 5, FX_A, DEV_EXCH_NO_STAGE, RPC_INVALID_ARGUMENT,
         "hello: stages 0-5, but the plan has stages 0..4"},
        {FX_JOB, FX_EPOCH, 4294967295u, 1, FX_A, DEV_EXCH_NO_STAGE, RPC_INVALID_ARGUMENT,
         "hello: stages 4294967295-1, but the plan has stages 0..4"},
        {FX_JOB, FX_EPOCH, 1, 3, FX_B, DEV_EXCH_NOT_LINK, RPC_INVALID_ARGUMENT,
         "hello: stages 1 and 3 have no link in a pipeline of 5 stages"},
        {FX_JOB, FX_EPOCH, 1, 0, FX_B, DEV_EXCH_NOT_LINK, RPC_INVALID_ARGUMENT,
         "hello: stages 1 and 0 have no link in a pipeline of 5 stages"},
        {FX_JOB, FX_EPOCH, 2, 2, FX_B, DEV_EXCH_NOT_LINK, RPC_INVALID_ARGUMENT,
         "hello: stages 2 and 2 have no link in a pipeline of 5 stages"},
        {FX_JOB, FX_EPOCH, 2, 3, FX_C, DEV_EXCH_NOT_SERVED, RPC_FAILED_PRECONDITION,
         "hello: link 2-3 is served by stage 3's device d00000000000000c3, not this one"},
        {FX_JOB, FX_EPOCH, 1, 2, FX_B, DEV_EXCH_NOT_SERVED, RPC_FAILED_PRECONDITION,
         "hello: link 1-2 is within this device"},
        {FX_JOB, FX_EPOCH, 0, 1, FX_C, DEV_EXCH_WRONG_PEER, RPC_PERMISSION_DENIED,
         "hello: stage 0 is device d00000000000000a1's, not d00000000000000c3's"},
        {FX_JOB, FX_EPOCH, 3, 4, FX_A, DEV_EXCH_WRONG_PEER, RPC_PERMISSION_DENIED,
         "hello: stage 3 is device d00000000000000c3's, not d00000000000000a1's"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_err err = {0};
        int r = hello(cases[i].job, cases[i].epoch, cases[i].from, cases[i].to, cases[i].peer, &err);
        CHECKF(r == cases[i].refusal, "case %zu: %d, not %d (%s)", i, r, cases[i].refusal, err.msg);
        CHECKF(!strcmp(err.msg, cases[i].msg), "case %zu: '%s'", i, err.msg);
        CHECKF(dev_exch_refusal_code(r) == cases[i].code, "case %zu: code %d", i,
               dev_exch_refusal_code(r));
    }
}

static void test_not_hellos(void)
{
    dev_exch_hello h;
    sl_err err = {0};
    static const uint8_t garbage[] = {0xff, 0xff, 0xff};
    CHECK(dev_exch_hello_parse(garbage, sizeof garbage, &h, &err) == DEV_EXCH_NOT_HELLO);
    CHECK(!strcmp(err.msg, "hello: not a StageFrame with a hello"));
    CHECK(dev_exch_hello_parse(garbage, 0, &h, &err) == DEV_EXCH_NOT_HELLO);
    CHECK(!strcmp(err.msg, "hello: not a StageFrame with a hello"));
    CHECK(dev_exch_refusal_code(DEV_EXCH_NOT_HELLO) == RPC_INVALID_ARGUMENT);

    uint8_t msg[4096];
    size_t len = fx_frame_msg(0, 1, DEV_DIR_ACTIVATION, msg, sizeof msg);
    CHECK(len > 0);
    CHECK(dev_exch_hello_parse(msg, len, &h, &err) == DEV_EXCH_NOT_HELLO);
    CHECKF(!strcmp(err.msg, "hello: a frame where the hello was due"), "%s", err.msg);

    /* the hello with an unknown field after it, and with a padded varint */
    rpc_buf m = {0};
    dev_exch_hello_pack(FX_JOB, FX_EPOCH, 0, 1, &m);
    uint8_t more[64];
    memcpy(more, m.data, m.len);
    more[m.len] = 0x18; /* field 3, varint 0 */
    more[m.len + 1] = 0x00;
    CHECK(dev_exch_hello_parse(more, m.len + 2, &h, &err) == DEV_EXCH_NOT_HELLO);
    char want[96];
    snprintf(want, sizeof want, "hello: %zu bytes that are not the hello's encoding", m.len + 2);
    CHECKF(!strcmp(err.msg, want), "%s", err.msg);
    CHECK(dev_exch_hello_parse(m.data, m.len, &h, &err) == DEV_EXCH_OK);
    CHECK(h.job == FX_JOB && h.epoch == FX_EPOCH && h.from == 0 && h.to == 1);
    rpc_buf_free(&m);
}

static void test_links(void)
{
    CHECK(!dev_exch_is_link(1, 0, 0));
    CHECK(dev_exch_is_link(2, 0, 1) && !dev_exch_is_link(2, 1, 0) && !dev_exch_is_link(2, 0, 2));
    CHECK(dev_exch_is_link(3, 0, 1) && dev_exch_is_link(3, 1, 2) && dev_exch_is_link(3, 0, 2));
    for (int a = -1; a <= FX_STAGES; a++)
        for (int b = -1; b <= FX_STAGES; b++)
            CHECKF(dev_exch_is_link(FX_STAGES, a, b) == (a >= 0 && b >= 0 && fx_link(a, b) >= 0),
                   "%d-%d", a, b);
    /* two stages: the one link is the chain and the side link */
    CHECK(dev_exch_allowed(2, 0, 1, 1, DEV_DIR_ACTIVATION) && dev_exch_allowed(2, 0, 1, 1, DEV_DIR_LABELS));
    CHECK(dev_exch_allowed(2, 0, 1, 0, DEV_DIR_TIED) && !dev_exch_allowed(2, 0, 1, 0, DEV_DIR_LABELS));
    CHECK(!dev_exch_allowed(2, 0, 1, 1, DEV_DIR_ABORT));
}

/* dev_exch_frame of a frame from stage `from` to `to` on a flow of link a-b. */
static int frame(int from, int to, int dir, int a, int b, int down, sl_err *err)
{
    uint8_t msg[4096];
    size_t len = fx_frame_msg(from, to, dir, msg, sizeof msg);
    const uint8_t *fr;
    size_t n;
    dev_frame_hdr h;
    int r = dev_exch_frame(FX_STAGES, a, b, down, msg, len, &fr, &n, &h, err);
    if (r == DEV_FR_OK && (fr + n != msg + len || h.direction != dir))
        return -1;
    return r;
}

static void test_frames(void)
{
    sl_err err = {0};
    for (int l = 0; l < FX_NLINKS; l++)
        for (int down = 0; down < 2; down++)
            for (int dir = DEV_DIR_ACTIVATION; dir <= DEV_DIR_ABORT; dir++) {
                int a = fx_links[l][0], b = fx_links[l][1];
                int r = frame(down ? a : b, down ? b : a, dir, a, b, down, &err);
                int want = fx_may_carry(l, down, dir) ? DEV_FR_OK : DEV_FR_BAD_HEADER;
                CHECKF(r == want, "link %d-%d %s direction %d: %d (%s)", a, b,
                       down ? "down" : "up", dir, r, err.msg);
            }
    CHECK(frame(0, 1, DEV_DIR_GRADIENT, 0, 1, 1, &err) == DEV_FR_BAD_HEADER);
    CHECKF(!strcmp(err.msg, "a frame of kind gradient (direction 2) down link 0-1"), "%s", err.msg);
    CHECK(frame(4, 0, DEV_DIR_LABELS, 0, 4, 0, &err) == DEV_FR_BAD_HEADER);
    CHECKF(!strcmp(err.msg, "a frame of kind labels (direction 4) up link 0-4"), "%s", err.msg);
    CHECK(frame(1, 0, DEV_DIR_ACTIVATION, 0, 1, 1, &err) == DEV_FR_MISROUTED);
    CHECKF(!strcmp(err.msg, "a frame from stage 1 to 0 on the flow from 0 to 1"), "%s", err.msg);
    CHECK(frame(3, 4, DEV_DIR_ACTIVATION, 0, 1, 1, &err) == DEV_FR_MISROUTED);
    CHECKF(!strcmp(err.msg, "a frame from stage 3 to 4 on the flow from 0 to 1"), "%s", err.msg);

    const uint8_t *fr;
    size_t n;
    dev_frame_hdr h;
    rpc_buf m = {0};
    dev_exch_hello_pack(FX_JOB, FX_EPOCH, 0, 1, &m);
    CHECK(dev_exch_frame(FX_STAGES, 0, 1, 1, m.data, m.len, &fr, &n, &h, &err) == DEV_FR_BAD_HEADER);
    CHECKF(!strcmp(err.msg, "not a StageFrame holding a frame alone"), "%s", err.msg);
    rpc_buf_free(&m);
    uint8_t msg[4096];
    size_t len = fx_frame_msg(0, 1, DEV_DIR_ACTIVATION, msg, sizeof msg);
    /* the StageFrame's length one short: the frame no longer covers it */
    CHECK(dev_exch_frame(FX_STAGES, 0, 1, 1, msg, len - 1, &fr, &n, &h, &err) == DEV_FR_BAD_HEADER);
    CHECK(!fr && !n);
    /* a frame cut short inside a valid StageFrame */
    const uint8_t *whole;
    size_t nwhole;
    CHECK(rpc_frame_unwrap(msg, len, &whole, &nwhole) == 0 && nwhole > 20);
    uint8_t tag[11], cut[4096];
    size_t pre = rpc_frame_wrap(tag, 20);
    memcpy(cut, tag, pre);
    memcpy(cut + pre, whole, 20);
    CHECK(dev_exch_frame(FX_STAGES, 0, 1, 1, cut, pre + 20, &fr, &n, &h, &err) == DEV_FR_TRUNCATED);
}


/* A federation's net: chains per replica and sync links.
 *   stage    0  1  2  3  4  5
 *   device   A  C  A  B  D  E
 *   replica  0  0  0  1  2  2
 *   units   0-1 2-3 4  0-4 0-2 3-4     (3 layers: the head is unit 4)
 * Replica 0 is U-shaped on A; replica 1 is B alone; replica 2's head is on
 * E, which holds no embeddings: E receives the word embeddings for its
 * tied copy, from D of its own replica (over the side link 4-5) and from
 * the embeddings' stages of the others. */
static void test_federation(void)
{
    static const char *const dev[6] = {FX_A, FX_C, FX_A, FX_B, "d00000000000000d4",
                                       "d00000000000000e5"};
    static const int rep[6] = {0, 0, 0, 1, 2, 2}, fu[6] = {0, 2, 4, 0, 0, 3},
                     lu[6] = {1, 3, 4, 4, 2, 4};
    dev_net_stage st[6];
    memset(st, 0, sizeof st);
    for (int i = 0; i < 6; i++) {
        snprintf(st[i].device, sizeof st[i].device, "%s", dev[i]);
        st[i].replica = rep[i];
        st[i].first_unit = fu[i];
        st[i].last_unit = lu[i];
    }
    dev_net_cfg c = {.job = FX_JOB, .epoch = FX_EPOCH, .stages = 6, .stage = st, .self_id = FX_B,
                     .replicas = 3};
    /* the links, written out: each chain (0-1, 1-2, side 0-2; 4-5), then the
     * sync links between stages of different devices that share a unit, and
     * the tied copy's (E from the embeddings' stages) */
    static const int want[][2] = {{0, 1}, {1, 2}, {0, 2}, {4, 5}, {0, 3}, {1, 3}, {2, 3},
                                  {0, 4}, {1, 4}, {3, 4}, {1, 5}, {2, 5}, {3, 5}, {0, 5}};
    int nwant = (int)(sizeof want / sizeof want[0]), got = 0;
    for (int a = 0; a < 6; a++)
        for (int b = a + 1; b < 6; b++) {
            int w = 0;
            for (int k = 0; k < nwant; k++)
                w |= want[k][0] == a && want[k][1] == b;
            CHECKF(dev_exch_link(&c, a, b) == w, "link %d-%d: %d", a, b, w);
            got += dev_exch_link(&c, a, b);
        }
    CHECK(got == nwant);
    /* flows: who gives to whom */
    CHECK(dev_exch_sync_flow(&c, 0, 3) && dev_exch_sync_flow(&c, 3, 0)); /* units 0-1 */
    CHECK(dev_exch_sync_flow(&c, 2, 3) && dev_exch_sync_flow(&c, 3, 2)); /* the head */
    CHECK(!dev_exch_sync_flow(&c, 0, 1) && !dev_exch_sync_flow(&c, 0, 2)); /* one replica, A */
    CHECK(dev_exch_sync_flow(&c, 4, 5) && !dev_exch_sync_flow(&c, 5, 4)); /* E's tied copy */
    CHECK(dev_exch_sync_flow(&c, 0, 5) && !dev_exch_sync_flow(&c, 5, 0)); /* E gives no unit 0 */
    CHECK(dev_exch_sync_flow(&c, 5, 2) && dev_exch_sync_flow(&c, 2, 5)); /* the head */
    CHECK(dev_exch_sync_flow(&c, 5, 1) && dev_exch_sync_flow(&c, 1, 5)); /* unit 3 */
    /* A receives the word embeddings on stage 0, not on its head stage 2 */
    CHECK(dev_exch_sync_target(&c, 0, 0, 1) && !dev_exch_sync_target(&c, 2, 0, 1) &&
          dev_exch_sync_target(&c, 5, 0, 1) && !dev_exch_sync_target(&c, 5, 0, 0));
    /* what each flow carries: pipeline kinds within a chain, sync payloads
     * on sync flows only */
    CHECK(dev_exch_allowed_in(&c, 0, 1, 1, DEV_DIR_ACTIVATION) &&
          dev_exch_allowed_in(&c, 0, 2, 1, DEV_DIR_LABELS) &&
          dev_exch_allowed_in(&c, 4, 5, 1, DEV_DIR_ACTIVATION) &&
          dev_exch_allowed_in(&c, 4, 5, 1, DEV_DIR_LABELS));
    CHECK(!dev_exch_allowed_in(&c, 0, 3, 1, DEV_DIR_ACTIVATION) &&
          !dev_exch_allowed_in(&c, 2, 3, 1, DEV_DIR_LABELS) &&
          !dev_exch_allowed_in(&c, 3, 4, 0, DEV_DIR_GRADIENT));
    CHECK(dev_exch_allowed_in(&c, 0, 3, 1, DEV_DIR_SYNC) && dev_exch_allowed_in(&c, 0, 3, 0, DEV_DIR_SYNC) &&
          dev_exch_allowed_in(&c, 4, 5, 1, DEV_DIR_SYNC) && !dev_exch_allowed_in(&c, 4, 5, 0, DEV_DIR_SYNC) &&
          !dev_exch_allowed_in(&c, 0, 1, 1, DEV_DIR_SYNC));
    /* B serves the sync links its lower stages' devices open, to them only */
    int a, b;
    sl_err err = {0};
    dev_exch_hello h = {.job = FX_JOB, .epoch = FX_EPOCH, .from = 0, .to = 3};
    CHECKF(dev_exch_hello_check(&c, FX_A, &h, &a, &b, &err) == DEV_EXCH_OK && a == 0 && b == 3,
           "%s", err.msg);
    CHECK(dev_exch_hello_check(&c, FX_C, &h, &a, &b, &err) == DEV_EXCH_WRONG_PEER);
    h.from = 1;
    CHECKF(dev_exch_hello_check(&c, FX_C, &h, &a, &b, &err) == DEV_EXCH_OK, "%s", err.msg);
    h = (dev_exch_hello){.job = FX_JOB, .epoch = FX_EPOCH, .from = 3, .to = 4};
    CHECK(dev_exch_hello_check(&c, FX_B, &h, &a, &b, &err) == DEV_EXCH_NOT_SERVED);
    h = (dev_exch_hello){.job = FX_JOB, .epoch = FX_EPOCH, .from = 1, .to = 2};
    CHECK(dev_exch_hello_check(&c, FX_C, &h, &a, &b, &err) == DEV_EXCH_NOT_SERVED);
    /* a sync frame on a chain flow, or an activation on a sync flow: refused */
    uint8_t msg[512];
    size_t len = fx_frame_msg(0, 3, DEV_DIR_ACTIVATION, msg, sizeof msg);
    const uint8_t *fr;
    size_t n;
    dev_frame_hdr fh;
    CHECK(len > 0 && dev_exch_frame_in(&c, 0, 3, 1, msg, len, &fr, &n, &fh, &err) == DEV_FR_BAD_HEADER);
}

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    cfg = fx_cfg();
    RUN(test_hellos_accepted);
    RUN(test_hello_refusals);
    RUN(test_not_hellos);
    RUN(test_links);
    RUN(test_frames);
    RUN(test_federation);
    return sl_test_done();
}
