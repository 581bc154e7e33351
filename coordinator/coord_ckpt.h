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
    COORD_PIECE_OK,       /* written */
    COORD_PIECE_RANGE,    /* not where the file ends, after its end, or done already */
    COORD_PIECE_DAMAGED,  /* the last piece: size or checksum differs; the file starts again */
    COORD_PIECE_STORE,    /* the store could not write it (why) */
    COORD_PIECE_REFUSED,  /* the file holds tensors of units its device does not run, or is
                           * not a safetensors file; it starts again */
    COORD_PIECE_QUOTA,    /* past the device's or the job's share of the store */
};

/* A piece of a device's part of a step. */
typedef struct coord_piece {
    const char *device;      /* the uploader */
    int step;
    const char *name;        /* model.TAG.safetensors, optim.TAG.safetensors, data.json or
                              * data.DEVICE.json */
    uint64_t offset;
    const uint8_t *data;
    size_t len;
    int last;                /* with the whole file's size and BLAKE2b-256 */
    uint64_t size;
    const uint8_t *sum;
    size_t sum_len;
    const uint8_t *units;    /* [nunits]: the units the device runs */
    int nunits;
    int replica;             /* the replica the device serves (0 without replicas) */
} coord_piece;

/* The model's units (for which units a part's tensors are of), and the bytes
 * of parts a device and the whole job may have under way at once. */
void coord_ckpt_set_model(coord_ckpt *k, int nunits, uint64_t quota_device, uint64_t quota_job);

/* A step is complete when the parts of each of nrep replicas are
 * (coord_job's owners; 1 unless set), but those whose bit is set in away
 * (an owner away under outer:H: its replica has no stage). The manifest
 * then names each file's replica. */
void coord_ckpt_set_replicas(coord_ckpt *k, int nrep, uint32_t away);

/* Writes a piece; why gets the reason of a refusal. *complete: the step's
 * parts now cover every unit (model and optimizer) and the data record. A
 * device has at most 4 steps' parts under way. */
int coord_ckpt_piece(coord_ckpt *k, const coord_piece *q, int *complete, char *why, size_t cap);
/* A piece's expected offset, for the refusal's message. */
uint64_t coord_ckpt_part_size(const coord_ckpt *k, const char *device, int step, const char *name);

/* The unit a checkpoint tensor (a Hugging Face BERT name, a moment's
 * suffix allowed) is of: 0 the embeddings, 1..layers the encoder layers,
 * layers + 1 the head; -1 none. */
int coord_tensor_unit(const char *name, int layers);
/* The units the tensors of safetensors file `path` are of, into units[u]
 * (nunits = layers + 2); -1 (why) when it is not one or holds a tensor of
 * no unit. */
int coord_ckpt_file_units(const char *path, int nunits, uint8_t *units, char *why, size_t cap);

/* Writes step's manifest (its parts, config.json) and makes it the
 * committed directory; the parts of the steps up to it are dropped. */
int coord_ckpt_commit(coord_ckpt *k, int step, const char *config, const char *optimizer,
                      const char *optim_state, sl_err *err);
/* Removes a committed step's directory (the one before the new commit). */
void coord_ckpt_prune(coord_ckpt *k, int step);
/* A new epoch: the parts of uncommitted steps are dropped, in memory and
 * on disk. */
void coord_ckpt_drop_partials(coord_ckpt *k);

/* metrics.csv: a step's row (a METRICS effect: its loss, masked tokens, the
 * stages' reports, the links between the stages of each replica); the rows after `committed` dropped (*loss: the
 * last row kept's, 0 without one), and an older coordinator's header, of
 * fewer columns, replaced by the current one, its rows given the new
 * columns empty; the rows from step `from` on (without
 * the header; "" when from <= 0). */
int coord_ckpt_metrics_append(coord_ckpt *k, const coord_fx *f, sl_err *err);
int coord_ckpt_metrics_truncate(coord_ckpt *k, int committed, double *loss, sl_err *err);
char *coord_ckpt_metrics_from(const coord_ckpt *k, int from);

/* A committed step's directory (free()), partial or not. */
char *coord_ckpt_step_dir(const coord_ckpt *k, int step, int partial);
/* Whether `name` is a file FetchFile serves from a checkpoint directory. */
int coord_ckpt_servable(const char *name);

#endif
