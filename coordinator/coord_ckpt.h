/* coord_ckpt.h - a job's checkpoint store: STATE/jobs/ID/ holds
 * config.json, metrics.csv, ckpt/step-N/ (the committed step, and step 0's
 * start model) and ckpt/step-N.partial/ (parts arriving).
 *
 * Parts arrive a piece at a time, in order, each file hashed as it comes
 * (BLAKE2b-256, checked at its last piece); a step whose every part is in
 * is committed by writing its manifest and renaming its directory; the
 * step committed before it is then removed. metrics.csv gets a row per step
 * all stages reported, and loses the rows after the committed step when an
 * epoch begins.
 *
 * Not thread-safe: one caller at a time per job (the driver holds the job's
 * I/O lock). Writes go through a table of file operations so that tests can
 * fail the Nth write, fsync or rename. */
#ifndef COORD_CKPT_H
#define COORD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "coord_job.h"
#include "sl_err.h"

/* What the store writes with. Each returns as its system call does (-1 with
 * errno). NULL members: the system call. */
typedef struct coord_fileops {
    int (*open)(void *ud, const char *path, int flags, unsigned mode);
    long (*pwrite)(void *ud, int fd, const void *buf, size_t n, int64_t off);
    int (*fsync)(void *ud, int fd);
    int (*rename)(void *ud, const char *from, const char *to);
    void *ud;
} coord_fileops;

typedef struct coord_ckpt coord_ckpt;

#define COORD_MAX_FILE (64ull << 30)

/* The store of the job whose directory is `dir` (not touched yet). ops may
 * be NULL (the system calls); it must outlive the store. */
coord_ckpt *coord_ckpt_new(const char *dir, const coord_fileops *ops);
void coord_ckpt_free(coord_ckpt *k);
/* Writes through ops from here on (NULL: the system calls). */
void coord_ckpt_set_ops(coord_ckpt *k, const coord_fileops *ops);
const char *coord_ckpt_dir(const coord_ckpt *k);

enum {
    COORD_PIECE_OK,       /* written (*parts_done: the step's files complete so far) */
    COORD_PIECE_RANGE,    /* not where the file ends, after its end, or done already */
    COORD_PIECE_DAMAGED,  /* the last piece: size or checksum differs; the file starts again */
    COORD_PIECE_STORE,    /* the store could not write it (why) */
};
/* A piece of file `name` of `step`'s parts at `offset`; `last` with the
 * whole file's size and BLAKE2b-256. why gets the reason of a refusal. */
int coord_ckpt_piece(coord_ckpt *k, int step, const char *name, uint64_t offset,
                     const uint8_t *data, size_t len, int last, uint64_t size, const uint8_t *sum,
                     size_t sum_len, int *parts_done, char *why, size_t cap);
/* A piece's expected offset, for the refusal's message. */
uint64_t coord_ckpt_part_size(const coord_ckpt *k, int step, const char *name);

/* Writes step's manifest (its parts, config.json) and makes it the
 * committed directory. */
int coord_ckpt_commit(coord_ckpt *k, int step, const char *config, const char *optimizer,
                      const char *optim_state, sl_err *err);
/* Removes a committed step's directory (the one before the new commit). */
void coord_ckpt_prune(coord_ckpt *k, int step);
/* A new epoch: the parts of uncommitted steps are dropped, in memory and
 * on disk. */
void coord_ckpt_drop_partials(coord_ckpt *k);

/* metrics.csv: a step's row; the rows after `committed` dropped (*loss: the
 * last row kept's, 0 without one); the rows from step `from` on (without
 * the header; "" when from <= 0). */
int coord_ckpt_metrics_append(coord_ckpt *k, int step, int epoch, const coord_step_rep *rep, int p,
                              double step_s, double tokens_s, sl_err *err);
int coord_ckpt_metrics_truncate(coord_ckpt *k, int committed, double *loss, sl_err *err);
char *coord_ckpt_metrics_from(const coord_ckpt *k, int from);

/* A committed step's directory (free()), partial or not. */
char *coord_ckpt_step_dir(const coord_ckpt *k, int step, int partial);
/* Whether `name` is a file FetchFile serves from a checkpoint directory. */
int coord_ckpt_servable(const char *name);

#endif
