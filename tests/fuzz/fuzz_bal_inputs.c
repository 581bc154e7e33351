/* fuzz_bal_inputs.c - libFuzzer target: the balancer's devices and network
 * JSON. The input is devices.json, then (after the first NUL byte, if any)
 * network.json; the model is a fixed 2-layer BERT. An accepted problem is
 * planned (even always; optimal on up to 4 devices, also U-shaped around the
 * first device) and replayed: the plan covers every unit once, inclusive
 * ranges, fits each device's memory and does not beat the lower bound.
 * A refusal names one of the files and holds no control byte. */
#include <math.h>

#include "fuzz_bal.h"

static const char cfg[] = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
                          "\"intermediate_size\": 128, \"vocab_size\": 500}";

static void check_plan(const bal_problem *pb, int algo, int owner)
{
    bal_opts o = bal_opts_default();
    o.micro_batches = 4;
    o.data_owner = owner;
    sl_err err = {0};
    bal_plan *pl = bal_plan_make(pb, algo, &o, &err);
    if (!pl) {
        fz_message_ok(&err);
        return;
    }
    REQUIRE(pl->n_stages >= 1 && pl->stage[0].first == 0);
    REQUIRE(pl->stage[pl->n_stages - 1].last == bal_problem_n_units(pb) - 1);
    for (int i = 0; i + 1 < pl->n_stages; i++)
        REQUIRE(pl->stage[i].last + 1 == pl->stage[i + 1].first);
    if (owner >= 0)
        REQUIRE(pl->stage[0].device == owner && pl->stage[pl->n_stages - 1].device == owner);
    bal_timeline *tl = bal_simulate(pl, pl->schedule, 0, &err);
    REQUIRE(tl != NULL && isfinite(tl->iteration_s) && tl->iteration_s > 0);
    for (int i = 0; i < pl->n_stages; i++)
        REQUIRE(tl->stage[i].peak_mem_bytes <= pl->stage[i].mem_bytes);
    REQUIRE(tl->iteration_s >= bal_lower_bound(pb, 4, owner) * (1 - 1e-12));
    bal_timeline_free(tl);
    bal_plan_free(pl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t nd = nul ? (size_t)(nul - data) : size;
    char *dev = fz_text(data, nd);
    char *net = nul ? fz_text(nul + 1, size - nd - 1) : NULL;
    sl_err err = {0};
    bal_problem *pb = bal_problem_parse(cfg, "config.json", 2, 16, dev, "devices.json", net,
                                        "network.json", &err);
    if (pb) {
        REQUIRE(bal_problem_n_devices(pb) >= 1 && bal_problem_n_units(pb) == 4);
        check_plan(pb, BAL_EVEN, -1);
        if (bal_problem_n_devices(pb) <= 4) {
            check_plan(pb, BAL_OPTIMAL, -1);
            check_plan(pb, BAL_OPTIMAL, 0);
        }
        bal_problem_free(pb);
    } else {
        fz_message_ok(&err);
        REQUIRE(strncmp(err.msg, "devices.json", 12) == 0 || strncmp(err.msg, "network.json", 12) == 0);
    }
    free(dev);
    free(net);
    return 0;
}
