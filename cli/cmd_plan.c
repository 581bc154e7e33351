/* skyloom plan: the balancer offline. A BERT config, devices and network in;
 * a placement plan and its simulated iteration out (table, JSON, SVG). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "cli.h"

static const char usage_text[] =
    "usage: skyloom plan --config config.json --seq T --micro-batch B --devices devices.json\n"
    "                    --network network.json [--algo optimal|sky|even] [--micro-batches M]\n"
    "                    [--schedule 1f1b|gpipe] [--data-owner DEVICE | --first-device DEVICE]\n"
    "                    [--task mlm|classify] [--json] [--svg F] [--compare]\n\n"
    "Places the units of a BERT (embeddings, encoder layers, the head) on a chain of\n"
    "devices and replays one training iteration with the pipeline simulator.\n\n"
    "  --config F          BERT config.json (hidden_size, num_hidden_layers, ...)\n"
    "  --seq T             sequence length\n"
    "  --micro-batch B     sequences per micro-batch\n"
    "  --devices F         devices: id, site, memory, FLOP/s or measured unit times\n"
    "  --network F         bandwidth and latency inside and between sites\n"
    "  --algo A            optimal (default), sky (the Sky Computing allocator), even\n"
    "  --micro-batches M   micro-batches per iteration (default: chosen for <= 10% bubble)\n"
    "  --schedule S        1f1b (default) or gpipe\n"
    "  --data-owner D      device id that holds the embeddings and the head, as the chain's\n"
    "                      first and last stage (U-shaped: tokens and labels stay on D)\n"
    "  --first-device D    a plain chain that starts at device D (it holds the embeddings)\n"
    "  --json              print the plan and simulated timeline as JSON\n"
    "  --svg F             write a Gantt chart of the simulated iteration to F\n"
    "  --compare           run even, sky and optimal at the same micro-batch count\n"
    "  --task T            mlm (default: the MLM head) or classify (the sequence-\n"
    "                      classification head, num_labels classes)\n"
    "Formats: docs/balancer.md. Examples: docs/examples/.\n";

static void human_bytes(uint64_t b, char *out, size_t n)
{
    if (b >= (1ull << 30))
        snprintf(out, n, "%.2f GiB", (double)b / (1ull << 30));
    else
        snprintf(out, n, "%.1f MiB", (double)b / (1ull << 20));
}

static void print_table(const bal_plan *pl, const bal_timeline *tl, int n_dev, double lb)
{
    printf("%s, %s, %d micro-batches, %d of %d devices, %d units\n", bal_algo_name(pl->algo),
           bal_schedule_name(pl->schedule), pl->micro_batches, pl->n_stages, n_dev, pl->n_units);
    printf("%-5s %-16s %-10s %-9s %9s %9s %9s %8s %8s %8s %10s %10s\n", "stage", "device", "site",
           "units", "fwd ms", "bwd ms", "busy s", "send s", "recv s", "idle s", "peak mem",
           "memory");
    for (int i = 0; i < pl->n_stages; i++) {
        const bal_stage *s = &pl->stage[i];
        const bal_stage_stats *t = &tl->stage[i];
        char units[32], peak[32], mem[32];
        snprintf(units, sizeof units, "%d-%d", s->first, s->last);
        human_bytes(t->peak_mem_bytes, peak, sizeof peak);
        human_bytes(s->mem_bytes, mem, sizeof mem);
        printf("%-5d %-16.16s %-10.10s %-9s %9.3f %9.3f %9.4f %8.4f %8.4f %8.4f %10s %10s\n", i,
               s->id, s->site, units, 1e3 * s->fwd_s, 1e3 * s->bwd_s,
               t->fwd_s + t->bwd_s + t->optim_s, t->send_s, t->recv_s, t->idle_s, peak, mem);
    }
    for (int i = 0; i < pl->n_dropped; i++)
        printf("left out: %s: %s\n", pl->dropped[i].id, pl->dropped[i].reason);
    if (pl->data_owner >= 0)
        printf("data owner: %s runs the first and the last stage (U-shaped)\n", pl->stage[0].id);
    printf("iteration %.6f s (simulated), bubble %.1f%%, cycle %.6f s per micro-batch, "
           "estimate %.6f s\n", tl->iteration_s, 100 * tl->bubble, pl->cycle_s, pl->est_iter_s);
    printf("lower bound %.6f s for any plan at %d micro-batches: certified gap %.1f%%\n", lb,
           pl->micro_batches, 100 * (tl->iteration_s / lb - 1));
}

/* The plan's JSON with the bound every plan of the problem respects. */
static json_t *plan_json(const bal_problem *pb, const bal_plan *pl, const bal_timeline *tl,
                         int owner)
{
    json_t *j = bal_plan_json(pl, tl);
    double lb = bal_lower_bound(pb, pl->micro_batches, owner);
    json_object_set_new(j, "lower_bound_s", json_real(lb));
    json_object_set_new(j, "certified_gap", json_real(tl->iteration_s / lb - 1));
    return j;
}

static int write_file(const char *path, const char *text, sl_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n;
    bad |= fclose(f) != 0;
    return bad ? sl_err_set(err, SL_EIO, "%s: write failed", path) : 0;
}

int cmd_plan(int argc, char **argv)
{
    const char *config = NULL, *devices = NULL, *network = NULL, *svg = NULL, *owner = NULL,
               *first = NULL;
    int seq = 0, batch = 0, json = 0, compare = 0, algo = BAL_OPTIMAL, task = BAL_TASK_MLM;
    bal_opts o = bal_opts_default();
    sl_err err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--compare"))
            compare = 1;
        else if (!strcmp(a, "--config") || !strcmp(a, "--devices") || !strcmp(a, "--network") ||
                 !strcmp(a, "--svg") || !strcmp(a, "--seq") || !strcmp(a, "--micro-batch") ||
                 !strcmp(a, "--micro-batches") || !strcmp(a, "--algo") ||
                 !strcmp(a, "--schedule") || !strcmp(a, "--data-owner") ||
                 !strcmp(a, "--first-device") || !strcmp(a, "--task")) {
            if (i + 1 >= argc)
                return sl_cli_fail("plan", 2, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--config"))
                config = v;
            else if (!strcmp(a, "--devices"))
                devices = v;
            else if (!strcmp(a, "--network"))
                network = v;
            else if (!strcmp(a, "--svg"))
                svg = v;
            else if (!strcmp(a, "--data-owner"))
                owner = v;
            else if (!strcmp(a, "--first-device"))
                first = v;
            else if (!strcmp(a, "--task")) {
                if (strcmp(v, "mlm") && strcmp(v, "classify"))
                    return sl_cli_fail("plan", 2, "--task must be mlm or classify, got '%s'", v);
                task = strcmp(v, "mlm") ? BAL_TASK_CLASSIFY : BAL_TASK_MLM;
            }
            else if (!strcmp(a, "--seq")) {
                if (sl_parse_int(a, v, 1, 1000000, &seq, &err))
                    return sl_cli_fail("plan", 2, "%s", err.msg);
            } else if (!strcmp(a, "--micro-batch")) {
                if (sl_parse_int(a, v, 1, 65536, &batch, &err))
                    return sl_cli_fail("plan", 2, "%s", err.msg);
            } else if (!strcmp(a, "--micro-batches")) {
                if (sl_parse_int(a, v, 1, 100000, &o.micro_batches, &err))
                    return sl_cli_fail("plan", 2, "%s", err.msg);
            } else if (!strcmp(a, "--algo")) {
                if ((algo = bal_algo_parse(v)) < 0)
                    return sl_cli_fail("plan", 2, "unknown --algo '%s' (optimal, sky, even)", v);
            } else if ((o.schedule = bal_schedule_parse(v)) < 0)
                return sl_cli_fail("plan", 2, "unknown --schedule '%s' (1f1b, gpipe)", v);
        } else
            return sl_cli_fail("plan", 2, "unknown option '%s'", a);
    }
    if (!config || !devices || !network || !seq || !batch)
        return sl_cli_fail("plan", 2, "--config, --seq, --micro-batch, --devices and --network "
                           "are required (see skyloom plan --help)");
    bal_problem *pb = bal_problem_load_task(task, config, batch, seq, devices, network, &err);
    if (!pb)
        return sl_cli_fail("plan", 1, "%s", err.msg);
    int n_dev = bal_problem_n_devices(pb), rc = 0;
    if (owner && first) {
        bal_problem_free(pb);
        return sl_cli_fail("plan", 2, "--data-owner and --first-device exclude each other (a U "
                           "starts at its owner)");
    }
    const char *named = owner ? owner : first;
    int *slot = owner ? &o.data_owner : &o.first_device;
    for (int d = 0; named && d < n_dev && *slot < 0; d++)
        if (!strcmp(bal_problem_device(pb, d)->id, named))
            *slot = d;
    if (named && *slot < 0) {
        bal_problem_free(pb);
        return sl_cli_fail("plan", 1, "%s: no device '%s' in %s",
                           owner ? "--data-owner" : "--first-device", named, devices);
    }
    int algos[3] = {BAL_OPTIMAL, BAL_SKY, BAL_EVEN}, na = compare ? 3 : 1;
    if (!compare)
        algos[0] = algo;
    bal_plan *pl[3] = {0};
    bal_timeline *tl[3] = {0};
    char msg[3][512] = {{0}};
    for (int k = 0; k < na; k++) {
        if (k > 0 && pl[0]) /* the same micro-batch count for a fair comparison */
            o.micro_batches = pl[0]->micro_batches;
        sl_err e = {0};
        pl[k] = bal_plan_make(pb, algos[k], &o, &e);
        if (pl[k] && !(tl[k] = bal_simulate(pl[k], o.schedule, svg && k == 0, &e))) {
            bal_plan_free(pl[k]);
            pl[k] = NULL;
        }
        if (!pl[k])
            snprintf(msg[k], sizeof msg[k], "%s", e.msg);
    }
    if (!compare && !pl[0]) {
        rc = sl_cli_fail("plan", 1, "%s", msg[0]);
        goto out;
    }
    if (svg && pl[0]) {
        char *s = bal_timeline_svg(pl[0], tl[0]);
        int r = write_file(svg, s, &err);
        free(s);
        if (r) {
            rc = sl_cli_fail("plan", 1, "%s", err.msg);
            goto out;
        }
    }
    if (json) {
        json_t *out;
        if (compare) {
            out = json_object();
            for (int k = 0; k < na; k++)
                json_object_set_new(out, bal_algo_name(algos[k]),
                                    pl[k] ? plan_json(pb, pl[k], tl[k], o.data_owner)
                                          : json_pack("{s:s}", "error", msg[k]));
        } else
            out = plan_json(pb, pl[0], tl[0], o.data_owner);
        char *s = json_dumps(out, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        printf("%s\n", s);
        free(s);
        json_decref(out);
    } else if (compare) {
        double even = pl[2] ? tl[2]->iteration_s : 0;
        printf("%-8s %7s %6s %13s %9s %8s %11s\n", "algo", "stages", "m", "iteration s",
               "vs even", "bubble", "cycle s");
        for (int k = na - 1; k >= 0; k--) {
            if (!pl[k]) {
                printf("%-8s infeasible: %s\n", bal_algo_name(algos[k]), msg[k]);
                continue;
            }
            char vs[32] = "-";
            if (even > 0)
                snprintf(vs, sizeof vs, "%.2fx", even / tl[k]->iteration_s);
            printf("%-8s %7d %6d %13.6f %9s %7.1f%% %11.6f\n", bal_algo_name(algos[k]),
                   pl[k]->n_stages, pl[k]->micro_batches, tl[k]->iteration_s, vs,
                   100 * tl[k]->bubble, pl[k]->cycle_s);
        }
        if (!pl[0])
            rc = 1;
    } else
        print_table(pl[0], tl[0], n_dev,
                    bal_lower_bound(pb, pl[0]->micro_batches, o.data_owner));
out:
    for (int k = 0; k < 3; k++) {
        bal_timeline_free(tl[k]);
        bal_plan_free(pl[k]);
    }
    bal_problem_free(pb);
    return rc;
}
