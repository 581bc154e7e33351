/* attack.c - calls a device makes, made by hand, for tests/test_attack.sh:
 * an enrolled device (its state directory's certificate) speaking about a
 * job it may have no part in, or as another device.
 *
 *   attack STATE COORD report-lost JOB EPOCH VICTIM     a run failure naming VICTIM lost
 *   attack STATE COORD upload JOB EPOCH STEP NAME       one piece: a small safetensors
 *   attack STATE COORD fetch JOB NAME                   a checkpoint file ("" lists)
 *   attack STATE COORD plan JOB                         the signed plan
 *   attack STATE COORD step JOB EPOCH STAGE STEP        a step report
 *   attack STATE ADDR ping PEER                         Ping to PEER's Stage server at ADDR
 *
 * Prints "CODE details" (the rpc code's name) and exits 0 when the call was
 * made, 2 on bad arguments. The device id is the one the state holds
 * (device.json), as a device would give it. */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"

static char *state_path(const char *state, const char *name)
{
    size_t n = strlen(state) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", state, name);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: attack STATE COORD ACTION JOB ...\n");
        return 2;
    }
    const char *state = argv[1], *coord = argv[2], *action = argv[3], *job = argv[4];
    char *djson = state_path(state, "device.json"), *text = NULL;
    size_t len = 0;
    sl_err err = {0};
    if (sl_read_file(djson, 1 << 16, &text, &len, &err)) {
        fprintf(stderr, "attack: %s\n", err.msg);
        return 2;
    }
    json_error_t je;
    json_t *dj = json_loadb(text, len, 0, &je);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(dj, "device_id")) ?: "");
    json_decref(dj);
    free(text);
    free(djson);
    if (sodium_init() < 0)
        return 2;
    rpc_global_init();
    char *ca = state_path(state, "ca.crt"), *crt = state_path(state, "device.crt"),
         *key = state_path(state, "device.key");
    int ping = !strcmp(action, "ping") && argc == 5;
    rpc_channel_opts co = {.target = coord, .tls = {ca, crt, key}, .server_name = ping ? job : NULL};
    rpc_channel *ch = rpc_channel_create(&co, &err);
    if (!ch) {
        fprintf(stderr, "attack: %s\n", err.msg);
        return 2;
    }
    rpc_status st = {0};
    int code = -1;
    void *resp = NULL;
    if (!strcmp(action, "report-lost") && argc == 7) {
        Skyloom__V1__ReportTaskRequest q = SKYLOOM__V1__REPORT_TASK_REQUEST__INIT;
        char res[128];
        snprintf(res, sizeof res, "{\"lost\": \"%.40s\"}", argv[6]);
        q.device_id = id;
        q.job_id = (char *)job;
        q.kind = "run";
        q.epoch = (uint32_t)strtoul(argv[5], NULL, 10);
        q.ok = 0;
        q.reason = "the link to it broke";
        q.result = res;
        code = rpc_call_pb(ch, RPC_M_REPORT_TASK, &q, &skyloom__v1__report_task_response__descriptor,
                           &resp, 10000, &st);
    } else if (!strcmp(action, "upload") && argc == 8) {
        /* a well-formed part: one tensor of the embeddings */
        static const char hdr[] = "{\"bert.embeddings.LayerNorm.bias\": {\"dtype\": \"F32\", "
                                  "\"shape\": [2], \"data_offsets\": [0, 8]}}";
        uint8_t buf[256], sum[32];
        size_t hl = sizeof hdr - 1, n = 8 + hl + 8;
        for (int i = 0; i < 8; i++)
            buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
        memcpy(buf + 8, hdr, hl);
        memset(buf + 8 + hl, 0x42, 8);
        crypto_generichash(sum, sizeof sum, buf, n, NULL, 0);
        Skyloom__V1__UploadChunkRequest q = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
        q.device_id = id;
        q.job_id = (char *)job;
        q.epoch = (uint32_t)strtoul(argv[5], NULL, 10);
        q.step = (uint32_t)strtoul(argv[6], NULL, 10);
        q.name = argv[7];
        q.data.data = buf;
        q.data.len = n;
        q.last = 1;
        q.size = n;
        q.blake2b.data = sum;
        q.blake2b.len = sizeof sum;
        code = rpc_call_pb(ch, RPC_M_UPLOAD_CHUNK, &q, &skyloom__v1__upload_chunk_response__descriptor,
                           &resp, 10000, &st);
    } else if (!strcmp(action, "fetch") && argc == 6) {
        Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
        q.device_id = id;
        q.job_id = (char *)job;
        q.step = UINT32_MAX;
        q.name = argv[5];
        q.max_bytes = 4096;
        code = rpc_call_pb(ch, RPC_M_FETCH_FILE, &q, &skyloom__v1__fetch_file_response__descriptor,
                           &resp, 10000, &st);
        Skyloom__V1__FetchFileResponse *r = resp;
        for (size_t i = 0; code == RPC_OK && r && i < r->n_names; i++)
            printf("file %s\n", r->names[i]);
    } else if (!strcmp(action, "plan") && argc == 5) {
        Skyloom__V1__GetPlanRequest q = SKYLOOM__V1__GET_PLAN_REQUEST__INIT;
        q.device_id = id;
        q.job_id = (char *)job;
        code = rpc_call_pb(ch, RPC_M_GET_PLAN, &q, &skyloom__v1__signed_plan__descriptor, &resp,
                           10000, &st);
    } else if (!strcmp(action, "step") && argc == 8) {
        Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
        q.device_id = id;
        q.job_id = (char *)job;
        q.epoch = (uint32_t)strtoul(argv[5], NULL, 10);
        q.stage = (uint32_t)strtoul(argv[6], NULL, 10);
        q.step = (uint32_t)strtoul(argv[7], NULL, 10);
        q.loss = 0.5;
        code = rpc_call_pb(ch, RPC_M_REPORT_STEP, &q, &skyloom__v1__report_step_response__descriptor,
                           &resp, 10000, &st);
    } else if (ping) {
        Skyloom__V1__PingRequest q = SKYLOOM__V1__PING_REQUEST__INIT;
        q.device_id = id;
        q.payload.data = (uint8_t *)"ping";
        q.payload.len = 4;
        code = rpc_call_pb(ch, RPC_M_STAGE_PING, &q, &skyloom__v1__ping_response__descriptor, &resp,
                           10000, &st);
    } else {
        fprintf(stderr, "attack: unknown action or arguments: %s\n", action);
        rpc_channel_destroy(ch);
        return 2;
    }
    printf("%s %s\n", rpc_code_name(code), st.details);
    rpc_unpacked_free(resp);
    rpc_channel_destroy(ch);
    free(ca);
    free(crt);
    free(key);
    return 0;
}
