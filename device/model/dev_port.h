/* dev_port.h - how a stage runner (dev_pipe.h) reaches the rest of its
 * pipeline. The runner never knows whether a neighbour is a thread of this
 * process (dev_port_local) or another machine (the network port over
 * Stage/Exchange): both implement these calls, so every equivalence test of
 * the in-process pipeline covers the networked one too.
 *
 * What crosses, per step:
 *   stage i -> i+1   the boundary activation of each micro-batch (Bm,T,C)
 *                    with its valid mask (Bm,T) and its first sequence's
 *                    global index (dropout keys)
 *   stage i+1 -> i   the gradient of that activation (Bm,T,C)
 *   first -> last    the batch's labels (B,T) and masked-token count, once,
 *                    before the last stage's first forward (when the last
 *                    stage does not hold unit 0 itself)
 *   first <-> last   the tied word-embedding gradient (V,C), after the last
 *                    backward, when unit 0 and the head are on different
 *                    stages
 *   everyone         a gather of a few doubles per stage (the loss, the
 *                    per-tensor sums of squares of the global gradient norm),
 *                    concatenated in stage order so that every stage adds
 *                    them in the same order as one stage would
 * Calls block until done. A failed call returns -1 with err set; after any
 * failure (or dev_port_abort from another thread) every blocked and later
 * call fails too, so no stage waits forever for a neighbour that is gone. */
#ifndef DEV_PORT_H
#define DEV_PORT_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

typedef struct dev_port dev_port;

typedef struct dev_port_ops {
    /* A new step begins (1-based optimizer step; eval passes 0). */
    int (*begin)(dev_port *p, uint64_t step, sl_err *err);
    int (*send_act)(dev_port *p, int mb, const float *x, size_t n, const int32_t *valid,
                    size_t nvalid, sl_err *err);
    int (*recv_act)(dev_port *p, int mb, float *x, size_t n, int32_t *valid, size_t nvalid,
                    sl_err *err);
    int (*send_grad)(dev_port *p, int mb, const float *g, size_t n, sl_err *err);
    int (*recv_grad)(dev_port *p, int mb, float *g, size_t n, sl_err *err);
    int (*send_labels)(dev_port *p, const int32_t *labels, size_t n, int masked, sl_err *err);
    int (*recv_labels)(dev_port *p, int32_t *labels, size_t n, int *masked, sl_err *err);
    /* Sends mine (n floats) to the other end of the tied pair and receives
     * its partial into theirs; mine is not read after the call returns. */
    int (*tied_exchange)(dev_port *p, const float *mine, float *theirs, size_t n, sl_err *err);
    /* all[0..*n_all) = every stage's values in stage order (cap entries at
     * most); each stage may give a different count. */
    int (*gather)(dev_port *p, const double *mine, int n, double *all, int cap, int *n_all,
                  sl_err *err);
    /* Makes every blocked and later call fail with `why`. */
    void (*abort)(dev_port *p, const char *why);
    void (*free)(dev_port *p);
} dev_port_ops;

struct dev_port {
    const dev_port_ops *ops;
    int stages, index; /* p and this stage's place in the chain */
};

static inline void dev_port_abort(dev_port *p, const char *why)
{
    if (p)
        p->ops->abort(p, why);
}
static inline void dev_port_free(dev_port *p)
{
    if (p)
        p->ops->free(p);
}

/* ---- the in-process port: p stages on threads of this process ---- */

typedef struct dev_port_hub dev_port_hub;

typedef struct dev_port_hub_cfg {
    int stages;
    int depth;          /* messages each direction of a link holds (the micro-batch
                         * count: a send then never waits) */
    size_t act_floats;  /* largest activation or gradient */
    size_t valid_ints;  /* largest valid mask */
    size_t label_ints;  /* the batch's labels */
    size_t tied_floats; /* the tied gradient (0: no tied pair) */
    int gather_max;     /* most values one stage gives a gather */
} dev_port_hub_cfg;

dev_port_hub *dev_port_hub_create(const dev_port_hub_cfg *c, sl_err *err);
/* Stage i's port (owned by the hub; dev_port_free does nothing for it). */
dev_port *dev_port_hub_port(dev_port_hub *h, int i);
/* Clears an abort and every queue: the hub can run the next step after a
 * failed one. */
void dev_port_hub_reset(dev_port_hub *h);
void dev_port_hub_free(dev_port_hub *h);

#endif
