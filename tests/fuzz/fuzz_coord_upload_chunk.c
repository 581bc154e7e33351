/* fuzz_coord_upload_chunk.c - libFuzzer target: the coordinator's
 * UploadChunkRequest handler on a running job, pieces written to the
 * checkpoint store of a temporary state directory. First byte even: the
 * bytes as a request (fz_run_job). Odd: a piece built from the bytes for
 * one of the job's parts at a checkpoint step near its own, at the offset
 * the store expects or another, last or not, with the sum of what was
 * taken so far or a wrong one, so that random inputs complete parts and
 * commit steps as well as being refused. */
#include <sodium.h>

#include "fuzz_coord.h"

/* What the store took of each (step, part), as the device would track it. */
typedef struct sent {
    int step;
    uint64_t size;
    crypto_generichash_state hash;
} sent;
static sent fz_sent[8][3];

static void built(const uint8_t *data, size_t size)
{
    fz_job();
    fz_heartbeat();
    int epoch = 0, step = 0;
    fz_job_step(&epoch, &step);
    uint8_t b[8] = {0};
    memcpy(b, data, size < sizeof b ? size : sizeof b);
    const uint8_t *payload = size > 8 ? data + 8 : data;
    size_t len = size > 8 ? size - 8 : 0;
    char names[3][96];
    snprintf(names[0], sizeof names[0], "model.%s.safetensors", fz_device);
    snprintf(names[1], sizeof names[1], "optim.%s.safetensors", fz_device);
    snprintf(names[2], sizeof names[2], "data.json");
    static const char *const bad[4] = {"../../x", "model..safetensors", "", "optim.d0123456789abcdef.safetensors"};
    /* mostly what an honest device sends: each fault one value in eight */
    int fault = b[3] % 8, sum_fault = b[7] >> 5;
    int part = b[1] % 4, at = (step / 3 + 1 + (b[2] % 8 == 7)) * 3; /* checkpoint_every 3 */
    if (at < 1)
        at = 3;
    sent *s = &fz_sent[(at / 3) % 8][part < 3 ? part : 0];
    if (s->step != at) {
        s->step = at;
        s->size = 0;
        crypto_generichash_init(&s->hash, NULL, 0, 32);
    }
    Skyloom__V1__UploadChunkRequest q = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
    q.device_id = fault == 5 ? "d0123456789abcdef" : fz_device;
    q.job_id = fz_job_id;
    q.epoch = (uint32_t)(epoch - (fault == 6));
    q.step = (uint32_t)(fault == 7 ? b[4] : at);
    q.name = part < 3 ? names[part] : (char *)bad[b[4] & 3];
    q.offset = b[5] % 8 != 7 ? s->size : (uint64_t)b[5] << (b[6] & 63);
    q.data.data = (uint8_t *)payload;
    q.data.len = len;
    q.last = b[7] & 1;
    uint8_t sum[32];
    crypto_generichash_state h = s->hash;
    crypto_generichash_update(&h, payload, len);
    crypto_generichash_final(&h, sum, sizeof sum);
    if (sum_fault == 5)
        sum[b[7] % 32] ^= 1;
    q.size = sum_fault == 6 ? s->size + len + 1 : s->size + len;
    if (q.last) {
        q.blake2b.data = sum;
        q.blake2b.len = sum_fault == 7 ? 31 : 32;
    }
    if (b[6] % 4 == 0) /* the step's reports in first: its commit can go ahead */
        fz_job_train(at);
    rpc_peer peer;
    fz_peer((const uint8_t[]){2}, 1, &peer);
    rpc_buf in, resp = {0};
    rpc_pack(&q, &in);
    rpc_status st = {0};
    int code = coord_handle_upload_chunk(fz_coord, &peer, in.data, in.len, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0]))
        abort();
    if (code == RPC_OK && q.offset == s->size && fault < 5 && part < 3) {
        crypto_generichash_update(&s->hash, payload, len);
        s->size += len;
    } else if (code == RPC_DATA_LOSS) {
        s->size = 0; /* the store starts the file again */
        crypto_generichash_init(&s->hash, NULL, 0, 32);
    }
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size && data[0] & 1)
        built(data, size);
    else
        fz_run_job(coord_handle_upload_chunk, &skyloom__v1__upload_chunk_request__descriptor,
                   size ? data + 1 : data, size ? size - 1 : 0);
    return 0;
}
