/* fuzz_coord_report_step.c - libFuzzer target: the coordinator's
 * ReportStepRequest handler on a running job. First byte even: the bytes
 * as a request (fz_run_job: the caller's id, the job's id and epoch put in
 * as the next bytes say). Odd: a request built from the bytes around the
 * job's step (the stage, the step and epoch near the job's, figures that
 * may be negative, infinite or NaN, ops and frame refusals), so that random
 * inputs reach the job's own checks. */
#include <math.h>

#include "fuzz_coord.h"

static double fz_num(uint8_t b)
{
    static const double v[8] = {0.0, 0.01, 1.5, -1.0, 1e30, INFINITY, NAN, 7.0};
    return v[b & 7] * (1 + (b >> 3));
}

static void built(const uint8_t *data, size_t size)
{
    fz_job();
    fz_heartbeat();
    int epoch = 0, step = 0;
    fz_job_step(&epoch, &step);
    uint8_t b[24] = {0};
    memcpy(b, data, size < sizeof b ? size : sizeof b);
    Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
    q.device_id = b[1] & 1 ? "d0123456789abcdef" : fz_device;
    q.job_id = b[1] & 2 ? "j0000000000000000" : fz_job_id;
    q.epoch = (uint32_t)(epoch + (b[2] & 3) - 1);
    q.stage = b[3] & 3;
    q.step = (uint32_t)(step + (b[4] & 63) - 2);
    q.loss = fz_num(b[5]);
    q.grad_norm = fz_num(b[6]);
    q.fwd_s = fz_num(b[7]);
    q.bwd_s = fz_num(b[8]);
    q.step_s = fz_num(b[9]);
    q.raw_bytes = (uint64_t)b[10] << (b[11] & 63);
    q.wire_bytes_side = UINT64_MAX - b[12];
    /* sync bytes: in a job of one owner, and frames smaller than their payloads */
    q.raw_bytes_sync = b[12] & 1 ? (uint64_t)b[10] << (b[12] & 63) : 0;
    q.wire_bytes_sync = b[12] & 2 ? UINT64_MAX - b[11] : q.raw_bytes_sync - (b[12] >> 7);
    Skyloom__V1__OpSegment seg[4], *segs[4];
    q.n_ops = b[13] % 5;
    for (size_t i = 0; i < q.n_ops; i++) {
        skyloom__v1__op_segment__init(&seg[i]);
        seg[i].kind = (Skyloom__V1__OpKind)(b[14 + i] % 12);
        seg[i].micro_batch = (int32_t)(b[14 + i] >> 4) - 2;
        seg[i].start_s = fz_num(b[18 + (i & 1)]);
        seg[i].end_s = fz_num(b[20 + (i & 1)]);
        segs[i] = &seg[i];
    }
    q.ops = segs;
    Skyloom__V1__Count cnt[2], *cnts[2];
    static const char *const names[4] = {"bad_tag", "", "BAD NAME", "replay_too_old"};
    q.n_frames_refused = b[22] % 3;
    for (size_t i = 0; i < q.n_frames_refused; i++) {
        skyloom__v1__count__init(&cnt[i]);
        cnt[i].name = (char *)names[(b[23] >> (2 * i)) & 3];
        cnt[i].value = i ? UINT64_MAX : b[23];
        cnts[i] = &cnt[i];
    }
    q.frames_refused = cnts;
    rpc_peer peer;
    fz_peer((const uint8_t[]){2}, 1, &peer);
    rpc_buf in, resp = {0};
    rpc_pack(&q, &in);
    rpc_status st = {0};
    int code = coord_handle_report_step(fz_coord, &peer, in.data, in.len, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0]))
        abort();
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size && data[0] & 1)
        built(data, size);
    else
        fz_run_job(coord_handle_report_step, &skyloom__v1__report_step_request__descriptor,
                   size ? data + 1 : data, size ? size - 1 : 0);
    return 0;
}
