/* coord_render.c - the measured timeline (JSON and SVG), the loss curve and
 * the plan's chain as SVG, and the dashboard's pages: server-rendered HTML
 * with inline SVG, no scripts and no external assets. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bal.h"
#include "coord_internal.h"
#include "coord_obs.h"
#include "skyloom.pb-c.h"
#include "sl_mem.h"

/* ---- the measured timeline: JSON ------------------------------------------- */

void coord_trace_free(coord_obs_trace *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->p; i++)
        free(t->seg[i]);
    free(t->seg);
    free(t->nseg);
    free(t->step_s);
    free(t->device);
    free(t);
}

char *coord_trace_json(const char *job, const coord_obs_trace *t)
{
    if (!t)
        return NULL;
    json_t *stages = json_array();
    for (int i = 0; i < t->p; i++) {
        json_t *ops = json_array();
        for (int k = 0; k < t->nseg[i]; k++) {
            const coord_obs_seg *s = &t->seg[i][k];
            json_array_append_new(ops, json_pack("[i, i, f, f]", s->kind, s->mb, s->start, s->end));
        }
        json_array_append_new(stages, json_pack("{s:i, s:s, s:f, s:o}", "stage", i, "device",
                                                t->device[i], "step_s", t->step_s[i], "ops", ops));
    }
    json_t *o = json_pack("{s:s, s:i, s:i, s:o}", "job", job, "epoch", t->epoch, "step", t->step,
                          "stages", stages);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

coord_obs_trace *coord_trace_parse(const char *text, sl_err *err)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je), *st = json_object_get(o, "stages");
    int p = (int)json_array_size(st);
    if (!o || p < 1 || p > 4096) {
        json_decref(o);
        sl_err_set(err, SL_ECORRUPT, "the trace is not a JSON object with stages");
        return NULL;
    }
    coord_obs_trace *t = sl_xcalloc(1, sizeof *t);
    t->p = p;
    t->step = (int)json_integer_value(json_object_get(o, "step"));
    t->epoch = (int)json_integer_value(json_object_get(o, "epoch"));
    t->step_s = sl_xcalloc((size_t)p, sizeof *t->step_s);
    t->device = sl_xcalloc((size_t)p, sizeof *t->device);
    t->nseg = sl_xcalloc((size_t)p, sizeof *t->nseg);
    t->seg = sl_xcalloc((size_t)p, sizeof *t->seg);
    int bad = 0;
    for (int i = 0; i < p && !bad; i++) {
        json_t *x = json_array_get(st, (size_t)i), *ops = json_object_get(x, "ops");
        size_t n = json_array_size(ops);
        t->step_s[i] = json_number_value(json_object_get(x, "step_s"));
        snprintf(t->device[i], sizeof t->device[i], "%s",
                 json_string_value(json_object_get(x, "device")) ?: "?");
        bad = !json_is_array(ops) || n > COORD_TRACE_MAX_OPS || !isfinite(t->step_s[i]) ||
              t->step_s[i] < 0 || t->step_s[i] > 1e7;
        t->seg[i] = sl_xcalloc(n + 1, sizeof **t->seg);
        for (size_t k = 0; k < n && !bad; k++) {
            json_t *a = json_array_get(ops, k);
            coord_obs_seg *s = &t->seg[i][k];
            s->kind = (int)json_integer_value(json_array_get(a, 0));
            s->mb = (int)json_integer_value(json_array_get(a, 1));
            s->start = json_number_value(json_array_get(a, 2));
            s->end = json_number_value(json_array_get(a, 3));
            bad = json_array_size(a) != 4 || !isfinite(s->start) || !isfinite(s->end) ||
                  s->start < 0 || s->end < s->start || s->end > 1e7;
        }
        t->nseg[i] = (int)n;
    }
    json_decref(o);
    if (bad) {
        coord_trace_free(t);
        sl_err_set(err, SL_ECORRUPT, "the trace has a malformed stage or op");
        return NULL;
    }
    return t;
}

/* ---- the measured timeline: SVG -------------------------------------------- */

enum { CAT_FWD, CAT_BWD, CAT_SEND, CAT_RECV, CAT_SYNC, CAT_N };
static const char *const cat_color[CAT_N] = {"#4e79a7", "#59a14f", "#f28e2b", "#76b7b2", "#b07aa1"};
static const char *const cat_label[CAT_N] = {"forward", "backward", "send", "receive",
                                             "sync + optimizer"};

static int cat_of(int kind, const char **name)
{
    static const char *const names[] = {"?", "receive activation", "forward", "send activation",
                                        "receive gradient", "backward", "send gradient",
                                        "send labels", "receive labels",
                                        "tied exchange + norm", "optimizer"};
    *name = kind >= 0 && kind <= 10 ? names[kind] : "?";
    switch (kind) {
    case SKYLOOM__V1__OP_KIND__OP_FORWARD:
        return CAT_FWD;
    case SKYLOOM__V1__OP_KIND__OP_BACKWARD:
        return CAT_BWD;
    case SKYLOOM__V1__OP_KIND__OP_SEND_ACT:
    case SKYLOOM__V1__OP_KIND__OP_SEND_GRAD:
    case SKYLOOM__V1__OP_KIND__OP_SEND_LABELS:
        return CAT_SEND;
    case SKYLOOM__V1__OP_KIND__OP_RECV_ACT:
    case SKYLOOM__V1__OP_KIND__OP_RECV_GRAD:
    case SKYLOOM__V1__OP_KIND__OP_RECV_LABELS:
        return CAT_RECV;
    default:
        return CAT_SYNC;
    }
}

char *coord_trace_svg(const coord_obs_trace *t, double predicted_s)
{
    int p = t->p, left = 190, width = 1000, row = 28, top = 50;
    int height = top + p * row + 70;
    double T = 0;
    long total = 0;
    for (int i = 0; i < p; i++) {
        T = t->step_s[i] > T ? t->step_s[i] : T;
        for (int k = 0; k < t->nseg[i]; k++)
            T = t->seg[i][k].end > T ? t->seg[i][k].end : T;
        total += t->nseg[i];
    }
    if (predicted_s > T && predicted_s < 4 * T)
        T = predicted_s;
    if (!(T > 0))
        T = 1;
    double sx = width / T;
    sl_buf b = {0};
    sl_buf_printf(&b,
                     "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                     "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\" "
                     "class=\"measured\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                     left + width + 20, height, left + width + 20, height);
    double slow = 0;
    for (int i = 0; i < p; i++)
        slow = t->step_s[i] > slow ? t->step_s[i] : slow;
    sl_buf_printf(&b, "<text x=\"%d\" y=\"20\" font-size=\"14\">measured: step %d (epoch %d), "
                     "%d stages, step %.4f s</text>\n", left, t->step, t->epoch, p, slow);
    for (int i = 0; i < p; i++) {
        int y = top + i * row;
        sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"#e6e6e6\">"
                         "<title>idle</title></rect>\n", left, y, t->step_s[i] * sx, row - 6);
        sl_buf_printf(&b, "<text x=\"4\" y=\"%d\">stage %d ", y + 15, i);
        sl_buf_xml(&b, t->device[i]);
        sl_buf_printf(&b, "</text>\n");
        for (int k = 0; k < t->nseg[i]; k++) {
            const coord_obs_seg *s = &t->seg[i][k];
            const char *name;
            int c = cat_of(s->kind, &name);
            double x = left + s->start * sx, w = (s->end - s->start) * sx;
            if (w < 0.3)
                w = 0.3;
            sl_buf_printf(&b, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\">",
                             x, y, w, row - 6, cat_color[c]);
            if (total <= 20000) {
                if (s->mb >= 0)
                    sl_buf_printf(&b, "<title>%s mb %d: %.6f-%.6f s</title>", name, s->mb,
                                     s->start, s->end);
                else
                    sl_buf_printf(&b, "<title>%s: %.6f-%.6f s</title>", name, s->start, s->end);
            }
            sl_buf_printf(&b, "</rect>\n");
        }
    }
    if (predicted_s > 0 && predicted_s <= T) {
        double x = left + predicted_s * sx;
        sl_buf_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#c00\" "
                         "stroke-dasharray=\"4 3\"/><text x=\"%.1f\" y=\"%d\" fill=\"#c00\" "
                         "text-anchor=\"end\">predicted %.4f s</text>\n", x, top - 8, x,
                         top + p * row, x - 3, top - 10, predicted_s);
    }
    int ya = top + p * row + 4;
    for (int k = 0; k <= 10; k++) {
        double x = left + width * k / 10.0;
        sl_buf_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#444\"/>"
                         "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.3g s</text>\n", x, ya,
                         x, ya + 5, x, ya + 17, T * k / 10);
    }
    int yl = ya + 35, xl = left;
    for (int c = 0; c < CAT_N; c++) {
        sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                         "<text x=\"%d\" y=\"%d\">%s</text>\n", xl, yl, cat_color[c], xl + 16,
                         yl + 10, cat_label[c]);
        xl += 130;
    }
    sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"#e6e6e6\"/>"
                     "<text x=\"%d\" y=\"%d\">idle</text>\n</svg>\n", xl, yl, xl + 16, yl + 10);
    return b.s;
}

/* ---- the loss curve -------------------------------------------------------- */

void coord_loss_svg(const char *csv, sl_buf *out)
{
    enum { W = 640, H = 260, L = 56, R = 16, TOP = 16, BOT = 34, MAXPTS = 1000 };
    size_t cap = 1024, n = 0;
    double *xs = sl_xmalloc(cap * sizeof *xs), *ys = sl_xmalloc(cap * sizeof *ys);
    for (const char *line = csv; line && *line;) {
        const char *nl = strchr(line, '\n');
        int step, epoch;
        double loss;
        if (sscanf(line, "%d,%d,%lf", &step, &epoch, &loss) == 3 && isfinite(loss) && step > 0) {
            if (n == cap) {
                cap *= 2;
                xs = sl_xrealloc(xs, cap * sizeof *xs);
                ys = sl_xrealloc(ys, cap * sizeof *ys);
            }
            xs[n] = step;
            ys[n++] = loss;
        }
        line = nl ? nl + 1 : NULL;
    }
    /* at most MAXPTS points: the mean of each run of steps */
    if (n > MAXPTS) {
        size_t per = (n + MAXPTS - 1) / MAXPTS, m = 0;
        for (size_t i = 0; i < n; i += per) {
            double sx = 0, sy = 0;
            size_t k = 0;
            for (; k < per && i + k < n; k++) {
                sx += xs[i + k];
                sy += ys[i + k];
            }
            xs[m] = sx / (double)k;
            ys[m++] = sy / (double)k;
        }
        n = m;
    }
    sl_buf_printf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"loss\" width=\"%d\" "
                     "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
                     "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                     W, H, W, H);
    if (n == 0) {
        sl_buf_printf(out, "<text x=\"%d\" y=\"%d\">no step reported yet</text>\n</svg>\n", L,
                         H / 2);
        free(xs);
        free(ys);
        return;
    }
    double x0 = xs[0], x1 = xs[n - 1], y0 = ys[0], y1 = ys[0];
    for (size_t i = 0; i < n; i++) {
        y0 = ys[i] < y0 ? ys[i] : y0;
        y1 = ys[i] > y1 ? ys[i] : y1;
    }
    if (x1 <= x0)
        x1 = x0 + 1;
    double pad = (y1 - y0) * 0.05 + 1e-9;
    y0 -= pad;
    y1 += pad;
    double pw = W - L - R, ph = H - TOP - BOT;
    sl_buf_printf(out, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
                     "stroke=\"#999\"/>\n", L, TOP, pw, ph);
    for (int k = 0; k <= 4; k++) {
        double v = y0 + (y1 - y0) * k / 4, y = TOP + ph - ph * k / 4;
        double s = x0 + (x1 - x0) * k / 4, x = L + pw * k / 4;
        sl_buf_printf(out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>"
                         "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", L - 4,
                         y + 4, v, x, H - BOT + 14, s);
    }
    sl_buf_printf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
                     L + (int)pw / 2, H - 4);
    sl_buf_printf(out, "<polyline fill=\"none\" stroke=\"#4e79a7\" stroke-width=\"1.5\" points=\"");
    for (size_t i = 0; i < n; i++)
        sl_buf_printf(out, "%.1f,%.1f ", L + pw * (xs[i] - x0) / (x1 - x0),
                         TOP + ph - ph * (ys[i] - y0) / (y1 - y0));
    sl_buf_printf(out, "\"><title>loss over %zu points</title></polyline>\n</svg>\n", n);
    free(xs);
    free(ys);
}

/* ---- the plan's chain across sites ----------------------------------------- */

void coord_chain_svg(const char *plan_text, sl_buf *out)
{
    json_error_t je;
    json_t *pl = plan_text ? json_loads(plan_text, 0, &je) : NULL;
    json_t *st = json_object_get(pl, "stages");
    json_t *bst = json_object_get(json_object_get(pl, "balancer"), "stages");
    int p = (int)json_array_size(st);
    if (p < 1 || p > 4096) {
        sl_buf_printf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chain\" "
                         "width=\"400\" height=\"40\" viewBox=\"0 0 400 40\"><text x=\"8\" "
                         "y=\"24\" font-family=\"sans-serif\" font-size=\"12\">no plan yet</text>"
                         "</svg>\n");
        json_decref(pl);
        return;
    }
    /* a lane per site, in the order the chain reaches them */
    const char **sites = sl_xcalloc((size_t)p, sizeof *sites);
    int *lane = sl_xcalloc((size_t)p, sizeof *lane), nsites = 0;
    for (int i = 0; i < p; i++) {
        const char *s = json_string_value(json_object_get(json_array_get(bst, (size_t)i), "site"));
        s = s ? s : "?";
        int k = 0;
        while (k < nsites && strcmp(sites[k], s))
            k++;
        if (k == nsites)
            sites[nsites++] = s;
        lane[i] = k;
    }
    enum { BW = 150, GAP = 44, LH = 84, LEFT = 110, TOPM = 10, BH = 56 };
    int width = LEFT + p * (BW + GAP), height = TOPM + nsites * LH + 10;
    sl_buf_printf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chain\" width=\"%d\" "
                     "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
                     "font-size=\"11\">\n<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" "
                     "refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 "
                     "L10,5 L0,10 z\" fill=\"#444\"/></marker></defs>\n<rect width=\"100%%\" "
                     "height=\"100%%\" fill=\"white\"/>\n", width, height, width, height);
    for (int k = 0; k < nsites; k++) {
        int y = TOPM + k * LH;
        sl_buf_printf(out, "<rect x=\"4\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"8\" "
                         "fill=\"%s\" stroke=\"#bbb\"/><text x=\"12\" y=\"%d\" font-size=\"13\">"
                         "site ", y, width - 8, LH - 8, k % 2 ? "#f4f4f8" : "#f8f6f0", y + 20);
        sl_buf_xml(out, sites[k]);
        sl_buf_printf(out, "</text>\n");
    }
    for (int i = 0; i < p; i++) {
        json_t *s = json_array_get(st, (size_t)i);
        int x = LEFT + i * (BW + GAP), y = TOPM + lane[i] * LH + (LH - 8 - BH) / 2;
        const char *dev = json_string_value(json_object_get(s, "device"));
        sl_buf_printf(out, "<g class=\"stage\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                         "rx=\"5\" fill=\"#dbe6f1\" stroke=\"#4e79a7\"/><text x=\"%d\" y=\"%d\" "
                         "font-weight=\"bold\">stage %d: units %lld-%lld</text><text x=\"%d\" "
                         "y=\"%d\">", x, y, BW, BH, x + 6, y + 16, i,
                         (long long)json_integer_value(json_object_get(s, "first_unit")),
                         (long long)json_integer_value(json_object_get(s, "last_unit")), x + 6,
                         y + 32);
        sl_buf_xml(out, dev ? dev : "?");
        json_t *b = json_array_get(bst, (size_t)i);
        sl_buf_printf(out, "</text><text x=\"%d\" y=\"%d\">fwd %.2f ms, bwd %.2f ms</text>"
                         "</g>\n", x + 6, y + 48,
                         1e3 * json_number_value(json_object_get(b, "fwd_s")),
                         1e3 * json_number_value(json_object_get(b, "bwd_s")));
        if (i + 1 < p) {
            int y2 = TOPM + lane[i + 1] * LH + (LH - 8 - BH) / 2 + BH / 2;
            json_t *ln = json_object_get(b, "link_next");
            sl_buf_printf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444\" "
                             "marker-end=\"url(#arrow)\"><title>latency %.3f ms, activation %.3f ms"
                             "</title></line>\n", x + BW, y + BH / 2, x + BW + GAP - 2, y2,
                             1e3 * json_number_value(json_object_get(ln, "latency_s")),
                             1e3 * json_number_value(json_object_get(ln, "activation_s")));
        }
    }
    sl_buf_printf(out, "</svg>\n");
    free(sites);
    free(lane);
    json_decref(pl);
}

/* ---- the dashboard --------------------------------------------------------- */

static const char *const style =
    "body{font-family:sans-serif;margin:1.2em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}"
    "th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".online{color:#1a7f37}.offline{color:#888}.revoked,.failed{color:#b42318}"
    ".done{color:#1a7f37}.running{color:#1f5fbf}"
    "figure{margin:.5em 0}figcaption{font-size:.85em;color:#555}"
    "svg{max-width:100%;height:auto}"
    ".pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}"
    "@media (max-width:1100px){.pair{grid-template-columns:1fr}}";

static void page_head(sl_buf *b, const char *title, int refresh)
{
    sl_buf_printf(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if (refresh)
        sl_buf_printf(b, "<meta http-equiv=\"refresh\" content=\"%d\">", refresh);
    sl_buf_printf(b, "<title>");
    sl_buf_xml(b, title);
    sl_buf_printf(b, "</title><style>%s</style></head><body>\n", style);
}

static void human_bytes(char *out, size_t cap, double v)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int k = 0;
    while (v >= 1024 && k < 5) {
        v /= 1024;
        k++;
    }
    snprintf(out, cap, k ? "%.1f %s" : "%.0f %s", v, unit[k]);
}

typedef struct dev_row_ctx {
    coord *c;
    const coord_snapshot *s;
    sl_buf *b;
    int n;
} dev_row_ctx;

static int dev_row(void *ud, const coord_device *d)
{
    dev_row_ctx *x = ud;
    sl_buf *b = x->b;
    int64_t stale = 3 * (int64_t)x->c->o.heartbeat_ms / 1000 + 1;
    const char *state = d->revoked ? "revoked"
                        : d->last_heartbeat && x->s->now - d->last_heartbeat <= stale ? "online"
                                                                                      : "offline";
    const coord_obs_dev *seen = NULL;
    for (int i = 0; i < x->s->ndev && !seen; i++)
        if (!strcmp(x->s->dev[i].id, d->id))
            seen = &x->s->dev[i];
    Skyloom__V1__DeviceProfile *pr =
        d->profile_len ? rpc_unpack(&skyloom__v1__device_profile__descriptor, d->profile, d->profile_len)
                       : NULL;
    sl_buf_printf(b, "<tr><td><code>");
    sl_buf_xml(b, d->id);
    sl_buf_printf(b, "</code></td><td>");
    sl_buf_xml(b, d->name);
    sl_buf_printf(b, "</td><td>");
    sl_buf_xml(b, d->site);
    sl_buf_printf(b, "</td><td class=\"%s\">%s</td><td>%s</td>", state, state,
                     seen && seen->backend[0] ? seen->backend : pr ? (pr->cuda ? "cuda" : "cpu") : "?");
    char mem[32] = "?";
    if (pr)
        human_bytes(mem, sizeof mem, (double)pr->memory_bytes);
    sl_buf_printf(b, "<td class=\"n\">%u</td><td class=\"n\">%u</td><td class=\"n\">%s</td><td>",
                     seen ? seen->threads : 0, pr ? pr->cores : 0, mem);
    if (pr) {
        sl_buf_xml(b, pr->cpu_model);
        if (pr->cuda) {
            char g[32];
            human_bytes(g, sizeof g, (double)pr->gpu_memory_bytes);
            sl_buf_printf(b, "; GPU ");
            sl_buf_xml(b, pr->gpu_name);
            sl_buf_printf(b, " (%s)", g);
        }
    }
    if (d->last_heartbeat)
        sl_buf_printf(b, "</td><td class=\"n\">%lld s ago</td></tr>\n",
                         (long long)(x->s->now - d->last_heartbeat));
    else
        sl_buf_printf(b, "</td><td>never</td></tr>\n");
    rpc_unpacked_free(pr);
    x->n++;
    return 0;
}

int coord_dash_index(coord *c, coord_state *db, const coord_snapshot *s, sl_buf *b, sl_err *err)
{
    page_head(b, "Skyloom coordinator", 10);
    sl_buf_printf(b, "<h1>Skyloom coordinator</h1>\n<p>gRPC on <code>");
    sl_buf_xml(b, c->o.listen);
    sl_buf_printf(b, "</code> · state <code>");
    sl_buf_xml(b, c->o.state);
    sl_buf_printf(b, "</code> · <a href=\"/metrics\">metrics</a></p>\n<h2>Devices</h2>\n"
                     "<table id=\"devices\"><tr><th>device</th><th>name</th><th>site</th>"
                     "<th>state</th><th>backend</th><th>threads</th><th>cores</th><th>memory</th>"
                     "<th>profile</th><th>last heartbeat</th></tr>\n");
    dev_row_ctx x = {c, s, b, 0};
    if (coord_state_list_devices(db, dev_row, &x, err))
        return -1;
    sl_buf_printf(b, "</table>\n%s<h2>Jobs</h2>\n", x.n ? "" : "<p>no device enrolled yet</p>\n");
    if (!s->njob) {
        sl_buf_printf(b, "<p>no job yet (<code>skyloom job submit</code>)</p>\n");
    } else {
        sl_buf_printf(b, "<table id=\"jobs\"><tr><th>job</th><th>name</th><th>state</th>"
                         "<th>progress</th><th>committed</th><th>loss</th><th>tokens/s</th>"
                         "<th>stages</th><th>config</th><th>data</th><th>started</th>"
                         "<th>duration</th><th>reason</th></tr>\n");
        for (int i = s->njob - 1; i >= 0; i--) { /* newest first */
            const coord_obs_job *j = &s->job[i];
            if (j->refused)
                continue;
            char started[32] = "-";
            time_t t0 = (time_t)j->created;
            struct tm tm;
            if (gmtime_r(&t0, &tm))
                strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", &tm);
            int64_t end = j->ended ? j->ended : s->now;
            sl_buf_printf(b, "<tr><td><a href=\"/job/%s\"><code>%s</code></a></td><td class=\"name\">",
                          j->id, j->id);
            sl_buf_xml(b, j->name);
            sl_buf_printf(b, "</td><td class=\"%s\">"
                             "%s</td><td><progress max=\"%d\" value=\"%d\"></progress> %d/%d</td>"
                             "<td class=\"n\">%d</td><td class=\"n\">%.4f</td><td class=\"n\">%.0f</td>"
                             "<td class=\"n\">%d</td><td>L%d H%d</td><td><code>", j->state, j->state,
                             j->steps > 0 ? j->steps : 1, j->step, j->step, j->steps, j->committed,
                             j->loss, j->tokens_s, j->p, j->layers, j->hidden);
            sl_buf_xml(b, j->owner);
            sl_buf_printf(b, ":");
            sl_buf_xml(b, j->dataset);
            sl_buf_printf(b, "</code></td><td>%s</td><td class=\"n\">%lld s</td><td>", started,
                          (long long)(end > j->created ? end - j->created : 0));
            sl_buf_xml(b, j->reason);
            sl_buf_printf(b, "</td></tr>\n");
        }
        sl_buf_printf(b, "</table>\n");
    }
    sl_buf_printf(b, "</body></html>\n");
    return 0;
}

/* The simulator's timeline of the plan, or a note why not. */
static void predicted_svg(const char *plan_text, sl_buf *b, double *iter)
{
    json_error_t je;
    json_t *pj = plan_text ? json_loads(plan_text, 0, &je) : NULL;
    sl_err err = {0};
    *iter = 0;
    bal_plan *pl = pj ? bal_plan_from_json(json_object_get(pj, "balancer"), &err) : NULL;
    bal_timeline *tl = NULL;
    if (pl && (double)pl->n_stages * pl->micro_batches > 20000)
        sl_err_set(&err, SL_EINVAL, "%d stages x %d micro-batches: too many to draw", pl->n_stages,
                   pl->micro_batches);
    else if (pl)
        tl = bal_simulate(pl, pl->schedule, 1, &err);
    char *svg = tl ? bal_timeline_svg(pl, tl) : NULL;
    if (svg) {
        /* the balancer's SVG has a fixed size: a viewBox lets the page scale it */
        int w = 0, h = 0;
        const char *q = strstr(svg, "width=\"");
        if (q && sscanf(q, "width=\"%d\" height=\"%d\"", &w, &h) == 2 && !strncmp(svg, "<svg ", 5)) {
            sl_buf_printf(b, "<svg class=\"predicted\" viewBox=\"0 0 %d %d\" %s", w, h, svg + 5);
        } else {
            sl_buf_printf(b, "%s", svg);
        }
        *iter = tl->iteration_s;
    } else {
        sl_buf_printf(b, "<p>no prediction: ");
        sl_buf_xml(b, pj ? err.msg : "no plan yet");
        sl_buf_printf(b, "</p>\n");
    }
    free(svg);
    bal_timeline_free(tl);
    bal_plan_free(pl);
    json_decref(pj);
}

void coord_dash_job(const coord_snapshot *s, const char *csv, sl_buf *b)
{
    const coord_obs_job *j = &s->job[0];
    char title[64], up[32];
    snprintf(title, sizeof title, "job %s", j->id);
    page_head(b, title, 10);
    human_bytes(up, sizeof up, (double)j->upload_bytes);
    sl_buf_printf(b, "<p><a href=\"/\">coordinator</a></p>\n<h1>Job <code id=\"job-id\">%s</code>"
                     "</h1>\n<table id=\"summary\"><tr><th>state</th><td class=\"%s\">%s</td></tr>"
                     "<tr><th>progress</th><td><progress max=\"%d\" value=\"%d\"></progress> step "
                     "%d of %d, committed %d</td></tr><tr><th>loss</th><td>%.4f</td></tr>"
                     "<tr><th>throughput</th><td>%.0f tokens/s, %.3f s per step</td></tr>"
                     "<tr><th>plan</th><td>epoch %d, %d stages, batch %d x %d tokens</td></tr>"
                     "<tr><th>checkpoints</th><td>%llu committed, %s uploaded in %.1f s</td></tr>"
                     "<tr><th>data</th><td><code>", j->id, j->state, j->state,
                     j->steps > 0 ? j->steps : 1, j->step, j->step, j->steps, j->committed,
                     j->loss, j->tokens_s, j->step_s, j->epoch, j->p, j->batch, j->seq,
                     (unsigned long long)j->commits, up, j->upload_s);
    for (int r = 0; r < (j->nrep ? j->nrep : 1); r++) {
        if (r)
            sl_buf_printf(b, "</code>, <code>");
        sl_buf_xml(b, j->nrep ? j->rep[r].owner : j->owner);
        sl_buf_printf(b, ":");
        sl_buf_xml(b, j->nrep ? j->rep[r].dataset : j->dataset);
    }
    sl_buf_printf(b, "</code></td></tr>");
    if (j->reason[0]) {
        sl_buf_printf(b, "<tr><th>reason</th><td>");
        sl_buf_xml(b, j->reason);
        sl_buf_printf(b, "</td></tr>");
    }
    sl_buf_printf(b, "</table>\n");
    if (j->nrep) {
        sl_buf_printf(b, "<h2>Replicas</h2>\n<table id=\"replicas\"><tr><th>replica</th><th>owner"
                         "</th><th>dataset</th><th>stages</th><th>devices</th><th>loss</th>"
                         "<th>sync raw</th><th>sync on the wire</th></tr>\n");
        for (int r = 0; r < j->nrep; r++) {
            const coord_obs_replica *x = &j->rep[r];
            char raw[32], wire[32], loss[32] = "-";
            human_bytes(raw, sizeof raw, (double)x->sync_raw);
            human_bytes(wire, sizeof wire, (double)x->sync_wire);
            if (x->have_loss)
                snprintf(loss, sizeof loss, "%.4f", x->loss);
            sl_buf_printf(b, "<tr class=\"replica\"><td class=\"n\">%d</td><td><code>", r);
            sl_buf_xml(b, x->owner);
            sl_buf_printf(b, "</code></td><td><code>");
            sl_buf_xml(b, x->dataset);
            sl_buf_printf(b, "</code></td><td class=\"n\">%d-%d</td><td><code>", x->first_stage,
                          x->first_stage + x->stages - 1);
            sl_buf_xml(b, x->devices);
            sl_buf_printf(b, "</code></td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
                             "<td class=\"n\">%s</td></tr>\n", loss, raw, wire);
        }
        sl_buf_printf(b, "</table>\n<p>loss: each replica's own at the latest step; sync: the bytes "
                         "its stages sent the other replicas, added up over the steps reported</p>\n");
    }
    sl_buf_printf(b, "<h2>Loss</h2>\n<figure>");
    coord_loss_svg(csv, b);
    sl_buf_printf(b, "<figcaption>masked-LM loss per step (metrics.csv)</figcaption></figure>\n"
                     "<h2>Plan</h2>\n<figure>");
    coord_chain_svg(j->plan, b);
    sl_buf_printf(b, "<figcaption>the current plan: stages in chain order, a lane per site"
                     "</figcaption></figure>\n<h2>A recent step, measured and predicted</h2>\n"
                     "<div class=\"pair\"><figure>");
    sl_buf pred = {0};
    double iter = 0;
    predicted_svg(j->plan, &pred, &iter);
    if (j->trace) {
        char *svg = coord_trace_svg(j->trace, iter);
        sl_buf_printf(b, "%s", svg);
        free(svg);
        sl_buf_printf(b, "<figcaption>measured on the devices: step %d</figcaption>",
                         j->trace->step);
    } else {
        sl_buf_printf(b, "<p>no step traced yet</p>");
    }
    sl_buf_printf(b, "</figure><figure>%s<figcaption>predicted by the simulator for this plan"
                     "</figcaption></figure></div>\n", pred.s ? pred.s : "");
    free(pred.s);
    if (j->nstage) {
        sl_buf_printf(b, "<h2>Stages</h2>\n<table id=\"stages\"><tr><th>stage</th><th>device</th>"
                         "<th>steps</th><th>busy s</th><th>send s</th><th>receive s</th>"
                         "<th>sync s</th><th>idle s</th><th>busy</th></tr>\n");
        for (int i = 0; i < j->nstage; i++) {
            const coord_obs_stage *x = &j->stage[i];
            double all = x->busy_s + x->send_s + x->recv_s + x->sync_s + x->idle_s;
            sl_buf_printf(b, "<tr><td class=\"n\">%d</td><td><code>", x->stage);
            sl_buf_xml(b, x->device);
            sl_buf_printf(b, "</code></td><td class=\"n\">%llu</td><td class=\"n\">%.3f</td>"
                             "<td class=\"n\">%.3f</td><td class=\"n\">%.3f</td><td class=\"n\">%.3f"
                             "</td><td class=\"n\">%.3f</td><td class=\"n\">%.0f%%</td></tr>\n",
                             (unsigned long long)x->steps, x->busy_s, x->send_s, x->recv_s,
                             x->sync_s, x->idle_s, all > 0 ? 100 * x->busy_s / all : 0.0);
        }
        sl_buf_printf(b, "</table>\n");
    }
    if (j->nlink) {
        sl_buf_printf(b, "<h2>Links</h2>\n<table id=\"links\"><tr><th>from stage</th><th>to stage"
                         "</th><th>raw</th><th>on the wire</th><th>wire / raw</th></tr>\n");
        for (int i = 0; i < j->nlink; i++) {
            const coord_obs_link *l = &j->link[i];
            char r[32], w[32];
            human_bytes(r, sizeof r, (double)l->raw);
            human_bytes(w, sizeof w, (double)l->wire);
            sl_buf_printf(b, "<tr><td class=\"n\">%d</td><td class=\"n\">%d</td><td class=\"n\">%s"
                             "</td><td class=\"n\">%s</td><td class=\"n\">%.3f</td></tr>\n", l->from,
                             l->to, r, w, l->raw ? (double)l->wire / (double)l->raw : 0.0);
        }
        sl_buf_printf(b, "</table>\n");
    }
    sl_buf_printf(b, "</body></html>\n");
}
