/* bal.h - the balancer: cost model, layer placement and pipeline simulation.
 *
 *   bal_problem *pb = bal_problem_load("config.json", 8, 128, "devices.json",
 *                                      "network.json", &err);
 *   bal_opts o = bal_opts_default();            (1F1B, micro-batch count chosen)
 *   o.data_owner = d;                           (optional: U-shaped around device d)
 *   bal_plan *pl = bal_plan_make(pb, BAL_OPTIMAL, &o, &err);
 *   bal_timeline *tl = bal_simulate(pl, BAL_1F1B, 1, &err);
 *   ... pl->stage[i] (units first..last inclusive), tl->iteration_s,
 *       bal_lower_bound(pb, pl->micro_batches, o.data_owner) ...
 *   later, devices lost or joined: bal_replan(now, pl, &o, 0.05, &info, &err)
 *   bal_timeline_free(tl); bal_plan_free(pl); bal_problem_free(pb);
 *
 * A plan does not point into its problem: it carries every number the
 * simulator needs, so the coordinator can keep plans after freeing the
 * problem. Pure C: no I/O besides reading the three JSON inputs. */
#ifndef BAL_H
#define BAL_H

#include <jansson.h>
#include <stdint.h>

#include "sl_err.h"

#define BAL_NAME_MAX 64

/* ---- the model: a chain of layer units ---- */

enum bal_unit_kind { BAL_UNIT_EMBED = 0, BAL_UNIT_ENCODER = 1, BAL_UNIT_HEAD = 2 };

typedef struct bal_unit {
    int kind;             /* enum bal_unit_kind */
    double fwd_flops;     /* one micro-batch */
    double bwd_flops;
    uint64_t param_bytes; /* fp32 weights */
    uint64_t optim_bytes; /* AdamW m and v (fp32) + fp32 gradients */
    uint64_t out_bytes;   /* activation sent to the next unit (= gradient sent back) */
    uint64_t stash_bytes; /* kept per in-flight micro-batch until its backward */
} bal_unit;

/* A BERT config.json: the one reader for the balancer and the device.
 * Required: hidden_size, num_hidden_layers, num_attention_heads,
 * intermediate_size, vocab_size. Defaults as in transformers' BertConfig:
 * max_position_embeddings 512, type_vocab_size 2, layer_norm_eps 1e-12,
 * hidden_act "gelu", hidden_dropout_prob and attention_probs_dropout_prob
 * 0.1, initializer_range 0.02. The classification fields as
 * PretrainedConfig reads them: num_labels (2 unless the config says, or
 * id2label has another count), id2label ({"0": name, ...}, every id below
 * num_labels once) and label2id (its inverse), problem_type (null or one
 * of Hugging Face's three), classifier_dropout (null: hidden_dropout_prob).
 * Other keys Hugging Face writes are accepted and ignored, so its files
 * work unchanged; unknown keys are refused.
 *
 * The task is not read from the file: the caller sets it (skyloom train
 * --task, a job's "task" option). It decides the last unit: the MLM head,
 * or a sequence-classification head (pooler and classifier). */
enum bal_act { BAL_ACT_GELU = 0, BAL_ACT_GELU_TANH = 1 }; /* gelu; gelu_new, gelu_pytorch_tanh */
enum bal_task { BAL_TASK_MLM = 0, BAL_TASK_CLASSIFY = 1 };
/* problem_type: absent or null, or one of Hugging Face's values */
enum bal_problem_type {
    BAL_PROBLEM_NONE = 0, BAL_PROBLEM_SINGLE_LABEL = 1, BAL_PROBLEM_MULTI_LABEL = 2,
    BAL_PROBLEM_REGRESSION = 3
};
typedef struct bal_bert {
    int hidden, layers, heads, intermediate, vocab, max_pos, type_vocab;
    double ln_eps;
    int act; /* enum bal_act */
    double hidden_dropout, attn_dropout, init_range;
    int task;       /* enum bal_task: what the last unit is (set by the caller) */
    int num_labels; /* classes of the classification head */
    int problem_type; /* enum bal_problem_type */
    /* the classifier's dropout: classifier_dropout, or hidden_dropout_prob
     * when the config has none (null) */
    double classifier_dropout;
} bal_bert;
/* Classes a classification config may have. */
#define BAL_MAX_LABELS 65536
/* A class name's longest (bytes, UTF-8). */
#define BAL_MAX_LABEL_BYTES 256
/* Share of the tokens the MLM head (decoder and loss) runs at: BERT's 15%. */
#define BAL_MASK_FRAC 0.15
/* The sizes a config may have (the reader, bal_bert_check, the device). */
enum {
    BAL_MAX_HIDDEN = 16384, BAL_MAX_LAYERS = 256, BAL_MAX_HEADS = 1024,
    BAL_MAX_INTERMEDIATE = 65536, BAL_MAX_VOCAB = 1 << 22, BAL_MIN_VOCAB = 5,
    BAL_MAX_POS = 65536, BAL_MAX_TYPE_VOCAB = 1024
};

/* Parses config.json text; `name` starts every message, which names the line
 * and the field: "config.json:3: num_hidden_layers: must be between 1 and 256, got 0". */
int bal_bert_parse(bal_bert *b, const char *text, const char *name, sl_err *err);
int bal_bert_load(bal_bert *b, const char *path, sl_err *err);
/* The sizes: each within its limit, hidden a multiple of heads; for the
 * classification task 2..BAL_MAX_LABELS labels and a single-label
 * problem_type (or none). */
int bal_bert_check(const bal_bert *b, sl_err *err);

/* The class names of config.json's id2label, in id order (*names: n
 * sl_xstrdup'd strings in an sl_xmalloc'd array; free each and the array),
 * or *names NULL and *n 0 when the config has no id2label. The text must
 * be one bal_bert_parse accepted. */
int bal_bert_label_names(const char *text, const char *name, char ***names, int *n, sl_err *err);
/* Units for `cfg` at micro-batch `batch` x sequence `seq`: 0 embeddings,
 * 1..L encoder layers, L+1 the head and its loss (cfg->task: the MLM head,
 * or the classification head with num_labels classes). *out is
 * sl_xmalloc'd. This is the one cost description of a unit (the device's
 * tests check a stage's parameters and stash against it). */
int bal_bert_units(const bal_bert *cfg, int batch, int seq, bal_unit **out, int *n_units,
                   sl_err *err);

/* ---- devices and network ---- */

typedef struct bal_device {
    char id[BAL_NAME_MAX];
    char site[BAL_NAME_MAX];
    char host[BAL_NAME_MAX]; /* "" = a host of its own */
    char backend[16];        /* "cuda", "cpu", ... (informational) */
    uint64_t mem_bytes;      /* usable memory */
    double flops;            /* sustained FLOP/s; used when unit_fwd_s is NULL */
    const double *unit_fwd_s; /* measured seconds per unit (n_units each) or NULL */
    const double *unit_bwd_s;
    /* measured optimizer-step seconds per unit (the gradient norm and the
     * update) or NULL: estimated from the parameters at the device's rate */
    const double *unit_optim_s;
    /* Compute shared with other devices: devices naming the same cpu_pool
     * (a machine) draw on its pool_cpus cores, each using up to `cpus` of
     * them while it computes, and slow down in proportion when together they
     * ask for more (bal_simulate). Its measured times are taken as on cores
     * of its own. "" = a pool of its own: never slowed. Unlike `host`, a pool
     * says nothing about link speeds. */
    char cpu_pool[BAL_NAME_MAX];
    double pool_cpus; /* > 0 with a cpu_pool */
    double cpus;      /* > 0 with a cpu_pool; more than pool_cpus counts as pool_cpus */
    /* Its network namespace on the pool's machine ("" = unknown): devices of
     * one pool and one net_ns talk over loopback, whose messages take the
     * pool's cores too. */
    char net_ns[BAL_NAME_MAX];
} bal_device;

typedef struct bal_link {
    double bw;  /* bytes per second (> 0) */
    double lat; /* seconds */
} bal_link;

typedef struct bal_site_link {
    char a[BAL_NAME_MAX], b[BAL_NAME_MAX]; /* symmetric */
    bal_link link;
} bal_site_link;

typedef struct bal_site_inside {
    char site[BAL_NAME_MAX];
    bal_link link;
} bal_site_inside;

typedef struct bal_network {
    bal_link same_host;    /* two devices with the same non-empty host */
    bal_link inside_site;  /* default between hosts of one site */
    bal_link between_sites; /* default between sites */
    int n_inside;
    const bal_site_inside *inside; /* per-site overrides */
    int n_links;
    const bal_site_link *links;    /* per site-pair overrides */
} bal_network;

/* Defaults: same host 200 Gbit/s 5 us, inside a site 10 Gbit/s 0.1 ms,
 * between sites 1 Gbit/s 50 ms. */
bal_network bal_network_default(void);

typedef struct bal_problem bal_problem;

/* Copies everything it is given. Sites named by links must exist. */
bal_problem *bal_problem_new(const bal_unit *units, int n_units, const bal_device *dev, int n_dev,
                             const bal_network *net, sl_err *err);
/* Reads the three JSON files (formats in docs/balancer.md). Errors name the
 * file, the line and the field: "devices.json:7: devices[1].memory_gib: ...". */
bal_problem *bal_problem_load(const char *config_path, int batch, int seq,
                              const char *devices_path, const char *network_path, sl_err *err);
/* bal_problem_load for a task (enum bal_task; see bal_problem_parse_task). */
bal_problem *bal_problem_load_task(int task, const char *config_path, int batch, int seq,
                                   const char *devices_path, const char *network_path,
                                   sl_err *err);
/* The same from text already in memory; `*_name` is used in messages. */
bal_problem *bal_problem_parse(const char *config_text, const char *config_name, int batch,
                               int seq, const char *devices_text, const char *devices_name,
                               const char *network_text, const char *network_name, sl_err *err);
/* bal_problem_parse for a task (enum bal_task): its units' last is that
 * task's head (bal_bert_units). bal_problem_parse is BAL_TASK_MLM. */
bal_problem *bal_problem_parse_task(int task, const char *config_text, const char *config_name,
                                    int batch, int seq, const char *devices_text,
                                    const char *devices_name, const char *network_text,
                                    const char *network_name, sl_err *err);
void bal_problem_free(bal_problem *pb);
/* The same problem over the devices flagged in keep[n_devices], in their
 * order (indices renumbered), with the links among their sites. */
bal_problem *bal_problem_subset(const bal_problem *pb, const unsigned char *keep, sl_err *err);
/* The same problem with units 0..k as one unit (their costs, bytes and every
 * device's times summed; the boundary the last of them sends): a plan of it
 * keeps them on one stage, the data owner's when it holds unit 0. */
bal_problem *bal_problem_merge_prefix(const bal_problem *pb, int k, sl_err *err);

/* What the links carry per byte of a boundary tensor (fp32), forward
 * (activations) and back (their gradients): 1 without a codec, about 0.5
 * for fp16, 0.25 for int8. The planner and the plans it makes serialize
 * those bytes; 1 and 1 unless set. */
int bal_problem_set_wire(bal_problem *pb, double act, double grad, sl_err *err);

int bal_problem_n_units(const bal_problem *pb);
int bal_problem_n_devices(const bal_problem *pb);
const bal_unit *bal_problem_unit(const bal_problem *pb, int u);
const bal_device *bal_problem_device(const bal_problem *pb, int d); /* unit_*_s point into pb */
/* Seconds device d spends on unit u for one micro-batch. */
double bal_unit_fwd_s(const bal_problem *pb, int d, int u);
double bal_unit_bwd_s(const bal_problem *pb, int d, int u);
/* Optimizer step seconds on device d for units first..last (inclusive). */
double bal_optim_s(const bal_problem *pb, int d, int first, int last);
/* The link between two devices (same host, same site, or between sites). */
bal_link bal_problem_link(const bal_problem *pb, int d_from, int d_to);

/* ---- plans ---- */

enum bal_algo { BAL_EVEN = 0, BAL_SKY = 1, BAL_OPTIMAL = 2 };
enum bal_schedule { BAL_1F1B = 0, BAL_GPIPE = 1 };

const char *bal_algo_name(int algo);
int bal_algo_parse(const char *s);     /* -1 if unknown */
const char *bal_schedule_name(int s);
int bal_schedule_parse(const char *s); /* -1 if unknown */

typedef struct bal_opts {
    int schedule;      /* enum bal_schedule; the memory model follows it */
    int micro_batches; /* 0: the planner chooses */
    int max_micro_batches; /* upper limit when choosing (default 1024) */
    double target_bubble;  /* choose the smallest m whose estimated bubble is below (0.10) */
    int window;        /* 1F1B: count round trips over runs of stages in the cycle (default 1) */
    int data_owner;    /* device index, -1: none (default). The owner holds unit 0 and the
                        * head as the chain's first and last stage (a U-shaped chain) */
    int first_device;  /* device index, -1: any (default). A plain chain's first stage (unit
                        * 0) is on it: a data owner that keeps its tokens but not its labels.
                        * With data_owner set it must be -1 or the same device */
} bal_opts;

/* Start from this: every field has its default (data_owner and first_device -1). */
bal_opts bal_opts_default(void);

typedef struct bal_stage {
    int device;               /* index into the problem's devices */
    char id[BAL_NAME_MAX];
    char site[BAL_NAME_MAX];
    int first, last;          /* units first..last, inclusive */
    double fwd_s, bwd_s;      /* per micro-batch */
    double optim_s;           /* optimizer step */
    uint64_t static_bytes;    /* weights + optimizer state + gradients */
    uint64_t stash_bytes;     /* per in-flight micro-batch */
    uint64_t mem_bytes;       /* the device's usable memory */
    int max_inflight;         /* micro-batches stashed at most under the plan's schedule */
    int warmup;               /* forwards before the first backward (1F1B) */
    int extra;                /* lookahead micro-batches the link to the next stage adds */
    /* link to the next stage (unused on the last one) */
    double lat_s;             /* latency of the link to the next stage */
    double act_s, grad_s;     /* serialization time of one activation / gradient */
    char cpu_pool[BAL_NAME_MAX]; /* the device's (bal_device); "" = its own */
    double pool_cpus, cpus;
    char net_ns[BAL_NAME_MAX];
} bal_stage;

typedef struct bal_dropped {
    int device;
    char id[BAL_NAME_MAX];
    char reason[160];
} bal_dropped;

typedef struct bal_plan {
    int algo, schedule;
    int micro_batches;
    int n_units;
    int n_stages;
    bal_stage *stage;  /* in a U-shaped plan the first and last have the same device */
    int data_owner;    /* device holding unit 0 and the head when asked for one, else -1 */
    double *unit_fwd_s, *unit_bwd_s; /* n_units: seconds of unit u on the device running it */
    double *unit_optim_s;            /* n_units: its optimizer step there */
    int n_dropped;
    bal_dropped *dropped;
    double cycle_s;    /* steady-state seconds per micro-batch the planner predicts */
    double est_iter_s; /* planner's closed-form estimate of one iteration */
    double plan_s;     /* wall time the planner took (informational, not deterministic) */
} bal_plan;

/* Plans `algo` for pb. Infeasible memory fails with the shortfall in bytes
 * and the largest model (encoder layers) that would fit. */
bal_plan *bal_plan_make(const bal_problem *pb, int algo, const bal_opts *opts, sl_err *err);
/* A plan of bal_problem_merge_prefix(pb, k) in pb's units: the stage of
 * the merged unit starts at 0, every other range moves by k; per-unit
 * times are pb's on the device running each unit. */
int bal_plan_expand_prefix(bal_plan *pl, const bal_problem *pb, int k, sl_err *err);
/* bal_plan_make with units 0..home (the embeddings and `home` encoder
 * layers, as many as the model has) kept on one stage: the data owner's
 * (opts->data_owner or first_device) when it holds unit 0. home <= 0:
 * bal_plan_make itself. */
bal_plan *bal_plan_make_home(const bal_problem *pb, int algo, const bal_opts *opts, int home,
                             sl_err *err);
/* The `even` split (the Sky Computing paper's baseline): n_units over p
 * stages (p capped at n_units), floor(n/p) units each and the first n mod p
 * one more, as cut points cuts[0] = 0 < ... < cuts[p] = n_units; returns p. */
int bal_even_cuts(int n_units, int p, int *cuts);
/* A chain: devices in pipeline order and how the schedule runs over them.
 * 1F1B stage i warms up with p-i-1 forwards plus the extra micro-batches of
 * every later link (a lookahead that hides a slow link's round trip), so it
 * stashes min(m, p - i + sum of extra[l], l >= i) micro-batches; GPipe
 * stashes m everywhere. extra == NULL is the textbook 1F1B (p - i). */
typedef struct bal_chain {
    int p;
    const int *order; /* p device indices, each at most once (U-shaped: order[0] twice) */
    const int *extra; /* p-1 entries >= 0, or NULL */
    int m;            /* micro-batches per iteration */
    int schedule;     /* enum bal_schedule */
    int window;       /* 1F1B: count round trips over runs of stages in the cycle */
    int ushaped;      /* 1: order[p-1] == order[0], p >= 3: the two stages share that device's
                       * compute and memory (a data owner holding unit 0 and the head) */
} bal_chain;

/* A plan for a given chain and cut points (cuts[0]=0 < ... < cuts[p]=n_units);
 * validates the chain and memory. Used by tests, benchmarks and replanning. */
bal_plan *bal_plan_chain(const bal_problem *pb, const bal_chain *c, const int *cuts, sl_err *err);
void bal_plan_free(bal_plan *pl);

/* What a codec costs (bal_codec_cost): the bytes it sends per fp32 byte
 * ("none" 1, "fp16"/"bf16" 0.5, "int8" (4 + cols) / (4 cols) with a scale
 * per row of `cols`, "topk:F" 2F), and, for a sync round, the CPU of one
 * reference core (bench_sync, bench_link; docs/balancer.md):
 *   give_ns     per parameter a replica gives: encoded, and for a lossy
 *               codec its error feedback added, decoded and kept
 *   combine_ns  per parameter and per payload decoded and summed
 *   send_ns, recv_ns  per payload byte sent, received: the frame, the
 *               seal or open, gRPC and TLS */
typedef struct bal_codec {
    double payload;
    double give_ns, combine_ns;
    double send_ns, recv_ns;
} bal_codec;
int bal_codec_cost(const char *name, int cols, bal_codec *out, sl_err *err);

/* ---- federation: one replica per data owner ----
 *
 *   bal_fed_in in = {R, pb, owner, home, opts, ushaped, algo};
 *   bal_fed *f = bal_fed_place(&in, &err);
 *   ... f->plan[r] (its stages' devices index the whole problem),
 *       f->replica_of[d], f->slowest_s ...
 *
 * Each replica trains on its owner's data around its owner, and a device
 * serves at most one replica. Synchronised replicas go at the pace of the
 * slowest, so bal_fed_place minimises the largest simulated iteration
 * (greedily: the slowest replica takes the free device, or another
 * replica's, that shortens it most while the other stays faster; devices
 * that help no replica stay free; with a sync codec, of the placements the
 * greedy passes through, the one whose slowest iteration plus its share of
 * the sync round is smallest). bal_fed_even is the baseline: the
 * devices that own no data dealt in turn, an equal share per replica, each
 * replica then planned as bal_fed_place would. */
#define BAL_FED_MAX_REPLICAS 16
typedef struct bal_fed_in {
    int R;
    const bal_problem *const *pb; /* [R]: the same devices in the same order, each replica's
                                   * model at its own micro-batch */
    const int *owner;             /* [R] distinct device indices */
    const int *home;              /* [R] home layers per owner (NULL: none) */
    bal_opts opts;                /* micro_batches, schedule, ...; data_owner and first_device
                                   * are set per replica */
    int ushaped;                  /* each replica U-shaped around its owner, else a chain
                                   * starting there */
    int algo;
    /* The sync round the placement weighs (NULL: none): bal_fed_place
     * keeps the placement with the smallest slowest iteration plus
     * bal_fed_sync_round's round_s / sync_every. */
    const bal_codec *sync_codec;
    int sync_every;
} bal_fed_in;

typedef struct bal_fed {
    int R, n_dev;
    bal_plan **plan;  /* [R] */
    double *iter_s;   /* [R] each replica's simulated iteration */
    double slowest_s; /* the largest of them */
    int *replica_of;  /* [n_dev]: the replica a device serves in its plan, -1: none */
} bal_fed;

bal_fed *bal_fed_place(const bal_fed_in *in, sl_err *err);
bal_fed *bal_fed_even(const bal_fed_in *in, sl_err *err);
void bal_fed_free(bal_fed *f);


/* One sync round between R replicas' plans (their stages' devices index pb's
 * devices): for every unit, the device holding it in each replica sends the
 * unit's payload (param_bytes x codec->payload) to the device holding it in
 * every other replica, and the unit-0 payload also to another replica's
 * head device when that device does not hold unit 0 (the tied word
 * embeddings; all of unit 0 is counted). Every flow starts at once; flows
 * between two sites share that direction's link (a site's uplink), flows
 * inside a site share their device pair's. link_s is the slowest link's
 * latency plus its bytes over its bandwidth. cpu_s is the largest device's
 * CPU: what it gives, the R payloads it combines for every unit it holds
 * (the tied copy's holder too), the payload bytes it sends and receives,
 * at codec's reference-core costs over the device's `cpus` when it has a
 * cpu pool (at most one core; else one core). round_s = link_s + cpu_s;
 * bytes is what the round puts on all links. */
typedef struct bal_fed_sync {
    double round_s;
    double link_s, cpu_s;
    double bytes;
} bal_fed_sync;
int bal_fed_sync_round(const bal_problem *pb, const bal_plan *const *plan, int R,
                       const bal_codec *codec, bal_fed_sync *out, sl_err *err);

/* ---- re-planning after devices were lost or joined ----
 *
 *   bal_problem *now = bal_problem_new(...the devices present now...);
 *   bal_replan_info ri;
 *   bal_plan *next = bal_replan(now, running, NULL, 0.05, &ri, &err);
 *   ... ri.moved_units units change device; ri.new_s vs ri.fastest_s ...
 *
 * The old plan's devices are matched to the problem's by id. */
typedef struct bal_replan_info {
    double old_s;            /* the old plan's simulated iteration, on the devices it had */
    double fastest_s;        /* the fastest plan `optimal` finds over the devices present */
    int fastest_moved_units; /* units that plan runs on another device than before */
    double new_s;            /* the plan returned */
    int moved_units;         /* units it runs on another device than before */
    int lost, joined;        /* devices of the old plan gone; devices new to it */
} bal_replan_info;

/* A plan over pb's devices with old's micro-batch count and schedule (opts
 * for the rest; NULL: defaults) and old's data owner unless opts names one.
 * Among the fastest plan and the cuts that move the fewest units on its
 * chain and on the old chain without the lost devices, returns the one that
 * moves the fewest units within (1 + margin) x the fastest's simulated
 * iteration (margin 0: the fastest). info may be NULL. */
bal_plan *bal_replan(const bal_problem *pb, const bal_plan *old, const bal_opts *opts,
                     double margin, bal_replan_info *info, sl_err *err);

/* ---- the exact partition for one chain (exposed for tests and benchmarks) ---- */

/* The objective ("cycle", seconds per micro-batch) of cuts over the chain:
 * the largest of every stage's fwd+bwd time, every link's per-direction
 * serialization time and, for 1F1B with `window`, every run of stages i..j:
 * (compute + round trips, latency + serialization both ways, on the links
 * inside it) / (j - i + 1 + the extra lookahead of those links). INFINITY
 * when a stage's memory is exceeded. */
double bal_chain_cycle(const bal_problem *pb, const bal_chain *c, const int *cuts);
/* Minimum of bal_chain_cycle over all cuts (each stage non-empty), exact up to
 * a relative 1e-9; fills cuts (p+1). INFINITY when nothing fits. */
double bal_chain_best(const bal_problem *pb, const bal_chain *c, int *cuts);
/* Among the cuts whose bal_chain_cycle is at most `bound`, those whose first
 * micro-batch travels fastest: the smallest sum of every stage's fwd+bwd time
 * and every link's round trip (latency + serialization both ways), the fill
 * term of the estimated iteration. Fills cuts (p+1) and returns that sum;
 * INFINITY when no cut meets the bound. */
double bal_chain_fill(const bal_problem *pb, const bal_chain *c, double bound, int *cuts);
/* Lookahead that hides slow links at a given cycle: a link whose round trip
 * exceeds half the cycle gets ceil(round trip / cycle) extra micro-batches. */
void bal_chain_lookahead(const bal_problem *pb, const int *order, int p, double cycle, int m,
                         int *extra);

/* The exact search `optimal` runs up to 12 devices (a data owner not counted):
 * the smallest bottleneck cycle (every stage's fwd+bwd time, a data owner's
 * two stages added up; every link's serialization either way; memory for the
 * schedule's stash, textbook 1F1B) over every subset and order of the devices
 * and every cut. Fills order and cuts (up to 14 and 15 entries) and *p;
 * INFINITY (and *p = 0) when nothing fits or there are more devices. */
double bal_exact_best(const bal_problem *pb, int m, int schedule, int data_owner, int *order,
                      int *cuts, int *p);

/* A lower bound on the simulated iteration of every plan of pb with m
 * micro-batches: any subset and order of the devices, any cuts, 1F1B with
 * any warm-up or GPipe, with the given data owner (-1: none) or without.
 * Proved in docs/balancer.md; plan / bound - 1 is a certified gap. */
double bal_lower_bound(const bal_problem *pb, int m, int data_owner);
/* A lower bound on this plan's simulated iteration: its replay with every
 * stage computing on a device of its own (docs/balancer.md, "One plan's
 * critical path"), equal to bal_simulate where no two stages share a
 * device or a cpu pool, and far cheaper. 0 for a plan it cannot replay. */
double bal_plan_critical_path(const bal_plan *pl);

/* ---- the schedule: what one stage does in one iteration ---- */

enum bal_op_kind {
    BAL_OP_RECV_ACT = 0, /* the activation of micro-batch mb from the previous stage */
    BAL_OP_FWD,
    BAL_OP_SEND_ACT,     /* to the next stage */
    BAL_OP_RECV_GRAD,    /* the gradient of this stage's output, from the next stage */
    BAL_OP_BWD,
    BAL_OP_SEND_GRAD,    /* the gradient of this stage's input, to the previous stage */
};
typedef struct bal_op {
    int kind; /* enum bal_op_kind */
    int mb;   /* micro-batch */
} bal_op;
/* Most ops one stage runs in an iteration of m micro-batches. */
#define BAL_STAGE_OPS_MAX(m) (6 * (m))

/* Stage i's operations for one iteration (then the optimizer step) into ops
 * (BAL_STAGE_OPS_MAX(micro_batches) entries); returns their count, -1 on bad
 * arguments. GPipe: every forward, then every backward. 1F1B: `warmup`
 * forwards (-1: the textbook p-i-1; capped at m), then one forward and one
 * backward in turn, then the remaining backwards. A forward is preceded by
 * its receive (not on stage 0) and followed by its send (not on the last
 * stage); a backward the same in the other direction. The simulator replays
 * these ops and the stage runner (device/model/dev_pipe.h) executes them. */
int bal_stage_ops(int schedule, int stages, int i, int micro_batches, int warmup, bal_op *ops);
/* 1F1B warm-ups run without deadlock when each stage warms up with at least
 * one forward more than the next (both capped at m); refuses the first that
 * does not, naming it. */
int bal_warmups_check(int stages, int micro_batches, const int *warmup, sl_err *err);

/* ---- the simulator ---- */

enum bal_seg_kind { BAL_SEG_FWD = 0, BAL_SEG_BWD, BAL_SEG_OPT, BAL_SEG_SEND_ACT, BAL_SEG_SEND_GRAD };

typedef struct bal_segment {
    double start, end;
    int stage; /* compute: the stage; sends: the sending stage */
    int kind;  /* enum bal_seg_kind */
    int mb;    /* micro-batch, -1 for the optimizer step */
} bal_segment;

typedef struct bal_stage_stats {
    double fwd_s, bwd_s, optim_s; /* busy time by kind */
    double send_s, recv_s;        /* link serialization time out of / into the stage */
    double idle_s;                /* iteration - fwd - bwd - optim */
    double end_s;                 /* when this stage's optimizer step ends */
    int peak_inflight;
    uint64_t peak_mem_bytes;
} bal_stage_stats;

typedef struct bal_timeline {
    int schedule;
    int n_stages, micro_batches;
    double iteration_s;
    double bubble; /* sum of idle / (stages x iteration) */
    bal_stage_stats *stage;
    int n_seg;
    bal_segment *seg; /* NULL unless segments were asked for */
} bal_timeline;

/* Replays one iteration (m micro-batches, flush, optimizer step) event by event. */
bal_timeline *bal_simulate(const bal_plan *pl, int schedule, int segments, sl_err *err);
void bal_timeline_free(bal_timeline *tl);

/* ---- output ---- */

/* The plan (and timeline if not NULL) as JSON; caller json_decref()s. */
json_t *bal_plan_json(const bal_plan *pl, const bal_timeline *tl);
/* A Gantt chart of the timeline (needs segments) as an SVG document; free(). */
char *bal_timeline_svg(const bal_plan *pl, const bal_timeline *tl);
/* The plan bal_plan_json wrote (its timeline part ignored), for simulating
 * it again: every number the simulator uses, checked (finite, in range,
 * units contiguous from 0). NULL with the reason. */
bal_plan *bal_plan_from_json(const json_t *j, sl_err *err);

#endif
