/* skyloom job metrics and job compare: a job's metrics.csv, and jobs side
 * by side (their options and config in a table, their loss curves in one
 * SVG chart), from what GetJob returns. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "coord_obs.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_buf.h"
#include "sl_file.h"
#include "sl_mem.h"

/* GetJob returns metrics.csv's rows without its header. */
static const char metrics_header[] = COORD_METRICS_HEADER;

static Skyloom__V1__JobInfo *get_job(rpc_channel *ch, const char *target, const char *pki,
                                     const char *id, sl_err *err)
{
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    q.metrics_from = 1;
    Skyloom__V1__JobInfo *j = NULL;
    rpc_status st = {0};
    int code = rpc_call_pb(ch, RPC_M_GET_JOB, &q, &skyloom__v1__job_info__descriptor, (void **)&j,
                           60000, &st);
    if (code != RPC_OK) {
        cli_call_error(err, target, pki, code, st.details);
        return NULL;
    }
    return j;
}

int cmd_job_metrics(rpc_channel *ch, const char *target, const char *pki, const char *id)
{
    sl_err err = {0};
    Skyloom__V1__JobInfo *j = get_job(ch, target, pki, id, &err);
    if (!j)
        return sl_cli_fail("job", 1, "%s", err.msg);
    printf("%s\n%s", metrics_header, j->metrics);
    if (*j->metrics && j->metrics[strlen(j->metrics) - 1] != '\n')
        printf("\n");
    rpc_unpacked_free(j);
    return 0;
}

/* ---- compare ------------------------------------------------------------------ */

typedef struct run {
    char id[64], state[24], reason[160], data[160]; /* data: OWNER:DATASET ("-" before a plan) */
    unsigned step, steps, committed, seq;
    double loss;              /* of the latest step */
    json_t *options, *config; /* objects (empty when unknown) */
    double *x, *y;            /* the curve: step, loss */
    size_t n;
} run;

#define MAX_POINTS 4000

/* The rows of metrics.csv (step, epoch, loss, ...) as a curve; beyond
 * MAX_POINTS, the mean of each run of consecutive rows. */
static void curve_of(run *r, const char *csv)
{
    size_t cap = 0;
    for (const char *line = csv; line && *line;) {
        const char *nl = strchr(line, '\n');
        int step, epoch;
        double loss;
        if (sscanf(line, "%d,%d,%lf", &step, &epoch, &loss) == 3 && step > 0 && isfinite(loss)) {
            if (r->n == cap) {
                cap = cap ? 2 * cap : 256;
                r->x = sl_xrealloc(r->x, cap * sizeof *r->x);
                r->y = sl_xrealloc(r->y, cap * sizeof *r->y);
            }
            r->x[r->n] = step;
            r->y[r->n++] = loss;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (r->n > MAX_POINTS) {
        size_t per = (r->n + MAX_POINTS - 1) / MAX_POINTS, m = 0;
        for (size_t i = 0; i < r->n; i += per) {
            double sx = 0, sy = 0;
            size_t k = 0;
            for (; k < per && i + k < r->n; k++) {
                sx += r->x[i + k];
                sy += r->y[i + k];
            }
            r->x[m] = sx / (double)k;
            r->y[m++] = sy / (double)k;
        }
        r->n = m;
    }
}

static json_t *object_or_empty(const char *text, const char *key)
{
    json_error_t je;
    json_t *j = text && *text ? json_loads(text, 0, &je) : NULL;
    json_t *o = key ? json_object_get(j, key) : j;
    o = json_is_object(o) ? json_incref(o) : json_object();
    json_decref(j);
    return o;
}

/* A value as the table shows it: strings bare, the rest as JSON. */
static char *show(const json_t *v)
{
    if (!v)
        return sl_xstrdup("-");
    if (json_is_string(v))
        return sl_xstrdup(json_string_value(v));
    if (json_is_real(v)) {
        char b[64];
        snprintf(b, sizeof b, "%.6g", json_real_value(v));
        return sl_xstrdup(b);
    }
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    return s ? s : sl_xstrdup("?");
}

/* The keys of every run's `which` object (options or config), sorted. */
static json_t *all_keys(const run *r, int n, int config)
{
    json_t *keys = json_object();
    for (int i = 0; i < n; i++) {
        const char *k;
        json_t *v;
        json_object_foreach(config ? r[i].config : r[i].options, k, v)
            json_object_set_new(keys, k, json_true());
    }
    return keys;
}

static int differs(const run *r, int n, int config, const char *key)
{
    for (int i = 1; i < n; i++) {
        const json_t *a = json_object_get(config ? r[0].config : r[0].options, key);
        const json_t *b = json_object_get(config ? r[i].config : r[i].options, key);
        if (!json_equal((json_t *)a, (json_t *)b) && (a || b))
            return 1;
    }
    return 0;
}

#define COL_MAX 32

static void print_row(int mark, int name_w, const char *name, char **cells, int n, const int *w)
{
    printf("%c %-*s", mark ? '*' : ' ', name_w, name);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(cells[i]);
        if (l > COL_MAX)
            printf("  %.*s...", COL_MAX - 3, cells[i]);
        else
            printf("  %-*s", i + 1 < n ? w[i] : 0, cells[i]);
    }
    printf("\n");
}

static void print_table(const run *r, int n)
{
    static const char *const names[] = {"state", "step", "committed step", "last loss", "data",
                                        "sequence length"};
    enum { N_SUMMARY = 6 };
    int *w = sl_xcalloc((size_t)n, sizeof *w), name_w = (int)strlen("sequence length");
    char **cells = sl_xcalloc((size_t)n, sizeof *cells);
    for (int i = 0; i < n; i++)
        w[i] = (int)strlen(r[i].id) > (int)strlen(r[i].data) ? (int)strlen(r[i].id) : (int)strlen(r[i].data);
    /* the widths: every cell of the column, at most COL_MAX */
    for (int pass = 0; pass < 2; pass++) {
        json_t *keys = all_keys(r, n, pass);
        const char *k;
        json_t *v;
        json_object_foreach(keys, k, v) {
            name_w = (int)strlen(k) > name_w ? (int)strlen(k) : name_w;
            for (int i = 0; i < n; i++) {
                char *c = show(json_object_get(pass ? r[i].config : r[i].options, k));
                int l = (int)strlen(c);
                w[i] = l > w[i] ? (l > COL_MAX ? COL_MAX : l) : w[i];
                free(c);
            }
        }
        json_decref(keys);
    }
    for (int i = 0; i < n; i++)
        cells[i] = (char *)r[i].id;
    print_row(0, name_w, "job", cells, n, w);
    int ndiff = 0;
    for (int row = 0; row < N_SUMMARY; row++) {
        for (int i = 0; i < n; i++) {
            char b[64];
            if (row == 0)
                snprintf(b, 64, "%s", r[i].state);
            else if (row == 1)
                snprintf(b, 64, "%u/%u", r[i].step, r[i].steps);
            else if (row == 2)
                snprintf(b, 64, "%u", r[i].committed);
            else if (row == 3)
                snprintf(b, 64, r[i].step ? "%.4f" : "-", r[i].loss);
            else if (row == 5)
                snprintf(b, 64, r[i].seq ? "%u" : "-", r[i].seq);
            cells[i] = sl_xstrdup(row == 4 ? r[i].data : b);
        }
        int d = 0;
        for (int i = 1; i < n; i++)
            d |= strcmp(cells[i], cells[0]) != 0;
        print_row(row >= 4 && d, name_w, names[row], cells, n, w);
        ndiff += row >= 4 && d;
        for (int i = 0; i < n; i++)
            free(cells[i]);
    }
    for (int pass = 0; pass < 2; pass++) {
        json_t *keys = all_keys(r, n, pass);
        if (json_object_size(keys))
            printf("%s:\n", pass ? "config" : "options");
        const char *k;
        json_t *v;
        json_object_foreach(keys, k, v) {
            for (int i = 0; i < n; i++)
                cells[i] = show(json_object_get(pass ? r[i].config : r[i].options, k));
            int d = differs(r, n, pass, k);
            ndiff += d;
            print_row(d, name_w, k, cells, n, w);
            for (int i = 0; i < n; i++)
                free(cells[i]);
        }
        json_decref(keys);
    }
    printf(ndiff ? "(* %d row%s differ%s)\n" : "(the options and configs are the same)\n", ndiff,
           ndiff == 1 ? "" : "s", ndiff == 1 ? "s" : "");
    free(w);
    free(cells);
}

static void print_json(const run *r, int n)
{
    json_t *jobs = json_array(), *diff = json_array();
    for (int i = 0; i < n; i++) {
        json_t *curve = json_array();
        for (size_t k = 0; k < r[i].n; k++)
            json_array_append_new(curve, json_pack("[f, f]", r[i].x[k], r[i].y[k]));
        json_array_append_new(
            jobs, json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:s, s:i, s:O, s:O, s:o}", "job_id",
                            r[i].id, "state", r[i].state, "step", (int)r[i].step, "steps",
                            (int)r[i].steps, "committed_step", (int)r[i].committed, "reason",
                            r[i].reason, "data", r[i].data, "seq", (int)r[i].seq, "options",
                            r[i].options, "config", r[i].config, "loss", curve));
    }
    for (int i = 1; i < n; i++)
        if (strcmp(r[i].data, r[0].data)) {
            json_array_append_new(diff, json_string("data"));
            break;
        }
    for (int i = 1; i < n; i++)
        if (r[i].seq != r[0].seq) {
            json_array_append_new(diff, json_string("seq"));
            break;
        }
    for (int pass = 0; pass < 2; pass++) {
        json_t *keys = all_keys(r, n, pass);
        const char *k;
        json_t *v;
        json_object_foreach(keys, k, v) if (differs(r, n, pass, k)) {
            char name[300];
            snprintf(name, sizeof name, "%s%s", pass ? "config." : "", k);
            json_array_append_new(diff, json_string(name));
        }
        json_decref(keys);
    }
    json_t *o = json_pack("{s:o, s:o}", "jobs", jobs, "differ", diff);
    char *s = json_dumps(o, JSON_INDENT(2));
    printf("%s\n", s);
    free(s);
    json_decref(o);
}

/* One chart: a polyline per run (class "curve", data-job its id) over
 * shared axes, a legend of the job ids in their colours. */
static char *compare_svg(const run *r, int n)
{
    static const char *const color[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b",
                                        "#b07aa1", "#76b7b2", "#edc948", "#9c755f"};
    enum { W = 720, L = 64, R = 20, TOP = 30, PH = 300, BOT = 44, LEG = 18 };
    int H = TOP + PH + BOT + LEG * n + 8;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < r[i].n; k++) {
            x0 = fmin(x0, r[i].x[k]);
            x1 = fmax(x1, r[i].x[k]);
            y0 = fmin(y0, r[i].y[k]);
            y1 = fmax(y1, r[i].y[k]);
        }
    sl_buf b = {0};
    sl_buf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
                      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                      "<text x=\"%d\" y=\"18\" font-size=\"14\">loss per step</text>\n",
                  W, H, W, H, L);
    double pw = W - L - R;
    sl_buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%d\" fill=\"none\" "
                      "stroke=\"#999\"/>\n", L, TOP, pw, PH);
    if (!(x0 <= x1)) {
        sl_buf_printf(&b, "<text x=\"%d\" y=\"%d\">no step reported yet</text>\n", L + 10,
                      TOP + PH / 2);
        x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    }
    if (x1 <= x0)
        x1 = x0 + 1;
    double pad = (y1 - y0) * 0.05 + 1e-6;
    y0 -= pad;
    y1 += pad;
    for (int k = 0; k <= 4; k++) {
        double v = y0 + (y1 - y0) * k / 4, y = TOP + PH - PH * k / 4.0;
        double s = x0 + (x1 - x0) * k / 4, x = L + pw * k / 4;
        sl_buf_printf(&b, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>"
                          "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n",
                      L, L + pw, y, y, L - 4, y + 4, v, x, TOP + PH + 16, s);
    }
    sl_buf_printf(&b, "<text class=\"axis\" x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
                      "<text class=\"axis\" x=\"14\" y=\"%d\" text-anchor=\"middle\" "
                      "transform=\"rotate(-90 14 %d)\">loss</text>\n",
                  L + pw / 2, TOP + PH + 34, TOP + PH / 2, TOP + PH / 2);
    for (int i = 0; i < n; i++) {
        const char *c = color[i % 8];
        if (r[i].n) {
            sl_buf_printf(&b, "<polyline class=\"curve\" data-job=\"");
            sl_buf_xml(&b, r[i].id);
            sl_buf_printf(&b, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
            for (size_t k = 0; k < r[i].n; k++)
                sl_buf_printf(&b, "%s%.1f,%.1f", k ? " " : "", L + pw * (r[i].x[k] - x0) / (x1 - x0),
                              TOP + PH - PH * (r[i].y[k] - y0) / (y1 - y0));
            sl_buf_printf(&b, "\"><title>");
            sl_buf_xml(&b, r[i].id);
            sl_buf_printf(&b, ": %zu points</title></polyline>\n", r[i].n);
        }
        int ly = TOP + PH + BOT + LEG * i + 4;
        sl_buf_printf(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" "
                          "stroke-width=\"3\"/><text class=\"legend\" x=\"%d\" y=\"%d\">",
                      L, L + 24, ly, ly, c, L + 30, ly + 4);
        sl_buf_xml(&b, r[i].id);
        sl_buf_printf(&b, r[i].n ? " (%s, last loss %.4f)" : " (%s, no step reported)", r[i].state,
                      r[i].n ? r[i].y[r[i].n - 1] : 0.0);
        sl_buf_printf(&b, "</text>\n");
    }
    sl_buf_printf(&b, "</svg>\n");
    return b.s;
}

int cmd_job_compare(rpc_channel *ch, const char *target, const char *pki, const char *const *ids,
                    int n, const char *svg, int json)
{
    run *r = sl_xcalloc((size_t)n, sizeof *r);
    int rc = 0;
    sl_err err = {0};
    for (int i = 0; i < n && !rc; i++) {
        for (int k = 0; k < i; k++)
            if (!strcmp(ids[k], ids[i]))
                rc = sl_cli_fail("job", 2, "job compare: %s is named twice", ids[i]);
        Skyloom__V1__JobInfo *j = rc ? NULL : get_job(ch, target, pki, ids[i], &err);
        if (!j) {
            rc = rc ? rc : sl_cli_fail("job", 1, "%s", err.msg);
            break;
        }
        const Skyloom__V1__JobSummary *s = j->summary;
        snprintf(r[i].id, sizeof r[i].id, "%s", s->job_id);
        snprintf(r[i].state, sizeof r[i].state, "%s", s->state);
        snprintf(r[i].reason, sizeof r[i].reason, "%s", s->reason);
        r[i].step = s->step;
        r[i].steps = s->steps;
        r[i].committed = s->committed_step;
        r[i].loss = s->loss;
        r[i].options = object_or_empty(j->options, NULL);
        r[i].config = object_or_empty(j->plan, "config");
        json_t *data = object_or_empty(j->plan, "data"), *plan = object_or_empty(j->plan, NULL);
        const char *owner = json_string_value(json_object_get(data, "owner"));
        const char *dataset = json_string_value(json_object_get(data, "dataset"));
        snprintf(r[i].data, sizeof r[i].data, "%s%s%s", owner ? owner : "-", owner ? ":" : "",
                 owner && dataset ? dataset : "");
        r[i].seq = (unsigned)json_integer_value(json_object_get(plan, "seq"));
        json_decref(data);
        json_decref(plan);
        curve_of(&r[i], j->metrics);
        rpc_unpacked_free(j);
    }
    if (!rc) {
        if (json)
            print_json(r, n);
        else
            print_table(r, n);
    }
    if (!rc && svg) {
        char *doc = compare_svg(r, n);
        if (sl_write_file_atomic(svg, doc, strlen(doc), &err))
            rc = sl_cli_fail("job", 1, "%s", err.msg);
        else if (!json)
            printf("loss curves of %d jobs written to %s\n", n, svg);
        free(doc);
    }
    for (int i = 0; i < n; i++) {
        json_decref(r[i].options);
        json_decref(r[i].config);
        free(r[i].x);
        free(r[i].y);
    }
    free(r);
    return rc;
}
