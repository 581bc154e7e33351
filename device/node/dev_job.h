/* dev_job.h - a device's part in federated jobs: what the coordinator's
 * heartbeat replies ask (dev_agent_take_tasks), done off the heartbeat's
 * thread.
 *
 *   check    open the dataset the job names (only one this device serves
 *            with --data NAME=PATH), verify it, and check it against the
 *            job's config and range; report the shard's shape or the reason
 *   profile  measure this device for the job's shape (per-unit forward and
 *            backward seconds with the threads it trains with, memory) and
 *            its links to the other candidates (Stage/Ping: RTT, bandwidth)
 *   run      fetch the plan of the epoch, verify the coordinator's signature
 *            against the pinned CA, set up this device's stages and links,
 *            restore the committed checkpoint (or the job's initial model),
 *            train with the stage runner (dev_pipe.h) over the network port
 *            (dev_net.h), report every step, and every K steps write this
 *            device's checkpoint part and upload it (a thread of its own)
 *   stop     leave the job
 *
 * dev_jobs_exchange is the Stage service's Exchange handler: it reads the
 * stream's hello and hands the stream to the running job it names. */
#ifndef DEV_JOB_H
#define DEV_JOB_H

#include <stdint.h>

#include "dev_agent.h"
#include "dev_frame.h"
#include "dev_plan.h"
#include "rpc.h"
#include "sl_err.h"

typedef struct dev_dataset {
    char name[65];
    char path[4096];
} dev_dataset;

/* "NAME=PATH" into d; names are 1..64 of [A-Za-z0-9._-]. */
int dev_dataset_parse(const char *arg, dev_dataset *d, sl_err *err);

typedef struct dev_jobs_opts {
    dev_agent *agent;
    const dev_dataset *datasets;
    int n_datasets;
    int threads;            /* compute threads for training and profiling */
    uint64_t memory_bytes;  /* usable memory reported to the planner */
    const dev_kx_keypair *link_kp; /* this process's X25519 key pair */
    dev_policy policy;      /* for jobs on its datasets (checks and plans refuse what breaks it) */
} dev_jobs_opts;

typedef struct dev_jobs dev_jobs;

dev_jobs *dev_jobs_open(const dev_jobs_opts *o, sl_err *err);
/* Acts on one task; returns at once (work runs on threads). */
void dev_jobs_task(dev_jobs *j, const dev_task *t);
/* The Stage Exchange handler (dev_stagesvc_opts.exchange, ud = the jobs):
 * the stream's hello must come within DEV_EXCH_HELLO_MS. */
int dev_jobs_exchange(void *ud, const char *peer_id, rpc_stream *s, rpc_status *st);
/* Who may open an Exchange stream (dev_stagesvc_opts.admit): a device that
 * a running plan names at the other end of a link this device serves. */
int dev_jobs_admit(void *ud, const char *peer_id, rpc_status *st);
/* After a heartbeat brought the revoked devices: a run with a revoked
 * neighbour stops (its streams closed), and its failure report names it. */
void dev_jobs_revocations(dev_jobs *j);
/* Exchange streams closed for sending no hello in time, and for a malformed
 * hello, since the start. */
void dev_jobs_counts(dev_jobs *j, uint64_t *no_hello, uint64_t *bad_hello);
/* Stops every job this device runs and waits for its threads; from then on
 * tasks are ignored and Exchange streams refused. */
void dev_jobs_stop(dev_jobs *j);
/* Marks the checkpoint parts written and not uploaded yet (a device that
 * is asked to stop finishes uploading them first, so that the job can
 * commit their step): how many runs have one, and in what (at most cap
 * bytes: "job J step S", ...). */
int dev_jobs_mark_uploads(dev_jobs *j, char *what, size_t cap);
/* Whether every part marked is uploaded (or its upload failed, or its run
 * ended). */
int dev_jobs_marked_uploaded(dev_jobs *j);
/* Whether, besides, the coordinator committed each marked step (its run
 * tasks say the job's committed step): the other devices' parts of it
 * arrived while this one still served its stages. Under a coordinator whose
 * run tasks do not say it, the uploads are all there is to wait for. */
int dev_jobs_marked_committed(dev_jobs *j);
/* Whether the run tasks of every run with a marked part say the job's
 * committed step. */
int dev_jobs_commit_told(dev_jobs *j);
/* The job's committed step a run task's spec says ({"committed_step": N},
 * N in 0..2^31-1), or -1 for a spec without one or with anything else there
 * (it only ever raises the step a run holds). */
int dev_task_committed_step(const char *spec);
/* A "run" task while this device stops: only the job's committed step it
 * says is taken (no run starts). */
void dev_jobs_note_run(dev_jobs *j, const dev_task *t);
/* dev_jobs_stop, then frees j (after the Stage service that calls
 * dev_jobs_exchange has stopped). */
void dev_jobs_close(dev_jobs *j);

#endif
