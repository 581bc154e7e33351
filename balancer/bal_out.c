/* bal_out.c - a plan as JSON, a timeline as an SVG Gantt chart (strings in
 * memory; the caller writes them where it wants). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_buf.h"
#include "sl_mem.h"

json_t *bal_plan_json(const bal_plan *pl, const bal_timeline *tl)
{
    json_t *o = json_object();
    json_object_set_new(o, "algo", json_string(bal_algo_name(pl->algo)));
    json_object_set_new(o, "schedule", json_string(bal_schedule_name(pl->schedule)));
    json_object_set_new(o, "micro_batches", json_integer(pl->micro_batches));
    json_object_set_new(o, "units", json_integer(pl->n_units));
    json_object_set_new(o, "cycle_s", json_real(pl->cycle_s));
    json_object_set_new(o, "estimated_iteration_s", json_real(pl->est_iter_s));
    json_object_set_new(o, "data_owner", pl->data_owner >= 0 && pl->n_stages > 0
                                             ? json_string(pl->stage[0].id) : json_null());
    json_t *st = json_array();
    for (int i = 0; i < pl->n_stages; i++) {
        const bal_stage *s = &pl->stage[i];
        json_t *uf = json_array(), *ub = json_array(), *uo = json_array();
        for (int u = s->first; u <= s->last; u++) {
            json_array_append_new(uf, json_real(pl->unit_fwd_s[u]));
            json_array_append_new(ub, json_real(pl->unit_bwd_s[u]));
            json_array_append_new(uo, json_real(pl->unit_optim_s[u]));
        }
        json_t *x = json_pack("{s:i, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:i}",
                              "stage", i, "device", s->id, "site", s->site, "first_unit",
                              s->first, "last_unit", s->last, "fwd_s", s->fwd_s, "bwd_s",
                              s->bwd_s, "optim_s", s->optim_s, "static_bytes",
                              (json_int_t)s->static_bytes, "stash_bytes",
                              (json_int_t)s->stash_bytes, "memory_bytes",
                              (json_int_t)s->mem_bytes, "max_inflight", s->max_inflight);
        json_object_set_new(x, "device_index", json_integer(s->device));
        json_object_set_new(x, "unit_fwd_s", uf);
        json_object_set_new(x, "unit_bwd_s", ub);
        json_object_set_new(x, "unit_optim_s", uo);
        json_object_set_new(x, "warmup", json_integer(s->warmup));
        if (s->cpu_pool[0]) {
            json_t *cp = json_pack("{s:s, s:f, s:f}", "name", s->cpu_pool, "pool_cpus",
                                   s->pool_cpus, "cpus", s->cpus);
            if (s->net_ns[0])
                json_object_set_new(cp, "net_ns", json_string(s->net_ns));
            json_object_set_new(x, "cpu_pool", cp);
        }
        if (i + 1 < pl->n_stages)
            json_object_set_new(x, "link_next",
                                json_pack("{s:f, s:f, s:f, s:i}", "latency_s", s->lat_s,
                                          "activation_s", s->act_s, "gradient_s", s->grad_s,
                                          "lookahead", s->extra));
        if (tl) {
            const bal_stage_stats *t = &tl->stage[i];
            json_object_set_new(x, "simulated",
                                json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:I}", "fwd_s",
                                          t->fwd_s, "bwd_s", t->bwd_s, "optim_s", t->optim_s,
                                          "send_s", t->send_s, "recv_s", t->recv_s, "idle_s",
                                          t->idle_s, "peak_inflight", t->peak_inflight,
                                          "peak_memory_bytes", (json_int_t)t->peak_mem_bytes));
        }
        json_array_append_new(st, x);
    }
    json_object_set_new(o, "stages", st);
    json_t *dr = json_array();
    for (int i = 0; i < pl->n_dropped; i++)
        json_array_append_new(dr, json_pack("{s:s, s:s}", "device", pl->dropped[i].id, "reason",
                                            pl->dropped[i].reason));
    json_object_set_new(o, "left_out", dr);
    if (tl) {
        json_object_set_new(o, "iteration_s", json_real(tl->iteration_s));
        json_object_set_new(o, "bubble", json_real(tl->bubble));
    }
    return o;
}

char *bal_timeline_svg(const bal_plan *pl, const bal_timeline *tl)
{
    static const char *const color[] = {"#4e79a7", "#59a14f", "#b07aa1", "#f28e2b", "#e15759"};
    static const char *const label[] = {"forward", "backward", "optimizer step",
                                        "send activation", "send gradient"};
    int p = tl->n_stages, left = 150, width = 1000, row = 28, top = 50;
    int height = top + p * row + 70;
    double T = tl->iteration_s > 0 ? tl->iteration_s : 1, sx = width / T;
    sl_buf b = {0};
    sl_buf_printf(&b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
              "font-family=\"sans-serif\" font-size=\"11\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
              left + width + 20, height);
    sl_buf_printf(&b, "<text x=\"%d\" y=\"20\" font-size=\"14\">%s, %s, %d stages, %d micro-batches: "
              "iteration %.4f s, bubble %.1f%%</text>\n", left, bal_algo_name(pl->algo),
              bal_schedule_name(tl->schedule), p, tl->micro_batches, tl->iteration_s,
              100 * tl->bubble);
    for (int i = 0; i < p; i++) {
        int y = top + i * row;
        /* idle is the grey background; busy and send bars are drawn over it */
        sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#e6e6e6\"/>\n",
                  left, y, width, row - 6);
        sl_buf_printf(&b, "<text x=\"4\" y=\"%d\">%d ", y + 15, i);
        sl_buf_xml(&b, pl->stage[i].id);
        sl_buf_printf(&b, "</text>\n");
    }
    for (int k = 0; k < tl->n_seg; k++) {
        const bal_segment *s = &tl->seg[k];
        int y = top + s->stage * row;
        int send = s->kind >= BAL_SEG_SEND_ACT;
        double x = left + s->start * sx, w = (s->end - s->start) * sx;
        if (w < 0.3)
            w = 0.3;
        sl_buf_printf(&b, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\">"
                  "<title>%s mb %d: %.6f-%.6f s</title></rect>\n", x, send ? y + row - 11 : y,
                  w, send ? 4 : row - 12, color[s->kind], label[s->kind], s->mb, s->start, s->end);
    }
    int ya = top + p * row + 4;
    for (int t = 0; t <= 10; t++) {
        double x = left + width * t / 10.0;
        sl_buf_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#444\"/>"
                  "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.3g s</text>\n", x, ya, x,
                  ya + 5, x, ya + 17, T * t / 10);
    }
    int yl = ya + 35, xl = left;
    for (int k = 0; k < 5; k++) {
        sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                  "<text x=\"%d\" y=\"%d\">%s</text>\n", xl, yl, color[k], xl + 16, yl + 10,
                  label[k]);
        xl += 130;
    }
    sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"#e6e6e6\"/>"
              "<text x=\"%d\" y=\"%d\">idle</text>\n</svg>\n", xl, yl, xl + 16, yl + 10);
    return b.s;
}

/* ---- a plan back from its JSON --------------------------------------------- */

static int num_in(json_t *o, const char *k, double lo, double hi, double *v)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_number(x))
        return -1;
    *v = json_number_value(x);
    return isfinite(*v) && *v >= lo && *v <= hi ? 0 : -1;
}

static int int_in(json_t *o, const char *k, long long lo, long long hi, int *v)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return -1;
    *v = (int)json_integer_value(x);
    return 0;
}

bal_plan *bal_plan_from_json(const json_t *pj, sl_err *err)
{
    json_t *j = (json_t *)pj, *st = json_object_get(j, "stages");
    const char *algo = json_string_value(json_object_get(j, "algo"));
    const char *sched = json_string_value(json_object_get(j, "schedule"));
    int p = (int)json_array_size(st), m = 0, units = 0;
    if (!json_is_object(j) || !algo || bal_algo_parse(algo) < 0 || !sched ||
        bal_schedule_parse(sched) < 0 || p < 1 || p > 4096 ||
        int_in(j, "micro_batches", 1, 1 << 20, &m) || int_in(j, "units", 1, 1 << 20, &units)) {
        sl_err_set(err, SL_ECORRUPT, "plan: algo, schedule, micro_batches, units or stages "
                   "missing or out of range");
        return NULL;
    }
    bal_plan *pl = sl_xcalloc(1, sizeof *pl);
    pl->algo = bal_algo_parse(algo);
    pl->schedule = bal_schedule_parse(sched);
    pl->micro_batches = m;
    pl->n_units = units;
    pl->n_stages = p;
    pl->stage = sl_xcalloc((size_t)p, sizeof *pl->stage);
    pl->unit_fwd_s = sl_xcalloc((size_t)units, sizeof(double));
    pl->unit_bwd_s = sl_xcalloc((size_t)units, sizeof(double));
    pl->unit_optim_s = sl_xcalloc((size_t)units, sizeof(double));
    double cyc = 0, est = 0;
    num_in(j, "cycle_s", 0, 1e12, &cyc);
    num_in(j, "estimated_iteration_s", 0, 1e12, &est);
    pl->cycle_s = cyc;
    pl->est_iter_s = est;
    int next = 0, *warm = sl_xcalloc((size_t)p, sizeof *warm);
    for (int i = 0; i < p; i++) {
        json_t *x = json_array_get(st, (size_t)i), *ln = json_object_get(x, "link_next");
        bal_stage *s = &pl->stage[i];
        const char *id = json_string_value(json_object_get(x, "device"));
        const char *site = json_string_value(json_object_get(x, "site"));
        double a = 0, b = 0, c = 0, look = 0;
        int bad = !json_is_object(x) || !id || !site || int_in(x, "device_index", 0, 1 << 20, &s->device) ||
                  int_in(x, "first_unit", next, next, &s->first) ||
                  int_in(x, "last_unit", s->first, units - 1, &s->last) ||
                  num_in(x, "fwd_s", 0, 1e6, &s->fwd_s) || num_in(x, "bwd_s", 0, 1e6, &s->bwd_s) ||
                  num_in(x, "optim_s", 0, 1e6, &s->optim_s) ||
                  int_in(x, "warmup", 0, 1 << 20, &warm[i]);
        if (!bad && i + 1 < p)
            bad = num_in(ln, "latency_s", 0, 1e6, &a) || num_in(ln, "activation_s", 0, 1e6, &b) ||
                  num_in(ln, "gradient_s", 0, 1e6, &c) || num_in(ln, "lookahead", 0, 1 << 20, &look);
        if (bad) {
            free(warm);
            bal_plan_free(pl);
            sl_err_set(err, SL_ECORRUPT, "plan: stage %d is malformed", i);
            return NULL;
        }
        snprintf(s->id, sizeof s->id, "%s", id);
        snprintf(s->site, sizeof s->site, "%s", site);
        s->warmup = warm[i];
        s->lat_s = a;
        s->act_s = b;
        s->grad_s = c;
        s->extra = (int)look;
        json_t *cp = json_object_get(x, "cpu_pool");
        const char *pool = json_string_value(json_object_get(cp, "name"));
        const char *ns = json_string_value(json_object_get(cp, "net_ns"));
        if (cp && (!pool || !*pool || strlen(pool) >= sizeof s->cpu_pool ||
                   (ns && strlen(ns) >= sizeof s->net_ns) ||
                   num_in(cp, "pool_cpus", 1e-3, 1e6, &s->pool_cpus) ||
                   num_in(cp, "cpus", 1e-3, 1e6, &s->cpus))) {
            free(warm);
            bal_plan_free(pl);
            sl_err_set(err, SL_ECORRUPT, "plan: stage %d: cpu_pool is malformed", i);
            return NULL;
        }
        if (pool)
            snprintf(s->cpu_pool, sizeof s->cpu_pool, "%s", pool);
        if (pool && ns)
            snprintf(s->net_ns, sizeof s->net_ns, "%s", ns);
        json_t *uf = json_object_get(x, "unit_fwd_s"), *ub = json_object_get(x, "unit_bwd_s"),
               *uo = json_object_get(x, "unit_optim_s");
        for (int u = s->first; u <= s->last; u++) {
            double f = json_number_value(json_array_get(uf, (size_t)(u - s->first)));
            double g = json_number_value(json_array_get(ub, (size_t)(u - s->first)));
            double o = json_number_value(json_array_get(uo, (size_t)(u - s->first)));
            pl->unit_fwd_s[u] = isfinite(f) ? f : 0;
            pl->unit_bwd_s[u] = isfinite(g) ? g : 0;
            pl->unit_optim_s[u] = isfinite(o) ? o : 0;
        }
        next = s->last + 1;
    }
    /* warm-ups are not checked: the simulator reports a schedule that stalls */
    int rc = next != units ? sl_err_set(err, SL_ECORRUPT, "plan: the stages cover units 0-%d of %d",
                                        next - 1, units) : 0;
    free(warm);
    if (rc) {
        bal_plan_free(pl);
        return NULL;
    }
    pl->data_owner = json_is_string(json_object_get(j, "data_owner")) ? pl->stage[0].device : -1;
    return pl;
}
