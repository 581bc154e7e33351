/* cli.h - the subcommands of the `skyloom` binary. Each lives in its own
 * cmd_*.c file and is listed once in the table in main.c. */
#ifndef CLI_H
#define CLI_H

#include "dev_tok.h"
#include "dev_vocab.h"
#include "rpc.h"
#include "sl_cli.h"

int cmd_version(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_data(int argc, char **argv);
/* trust (issue #6) */
int cmd_certs(int argc, char **argv);
int cmd_coordinator(int argc, char **argv);
int cmd_device(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_job(int argc, char **argv);
/* skyloom job metrics and job compare (cmd_job_runs.c), over a channel to
 * the coordinator at target with the admin certificate of pki; they return
 * the exit status. */
int cmd_job_metrics(rpc_channel *ch, const char *target, const char *pki, const char *id);
int cmd_job_compare(rpc_channel *ch, const char *target, const char *pki, const char *const *ids,
                    int n, const char *svg, int json);
/* Helpers for the commands above (cli_util.c). */
/* A class or token with its probability. */
typedef struct cli_scored {
    int id;
    double p;
} cli_scored;
/* out[0..n) = softmax(logits[0..n)) (in double, less the largest logit),
 * most probable first, ties by id: what Hugging Face's pipelines rank. */
void cli_softmax_ranked(const float *logits, int n, cli_scored *out);
/* Makes SIGINT and SIGTERM set a flag instead of killing the process; the
 * flag (the signal number, 0 before any) is what cli_stop_signal returns. */
void cli_catch_stop_signals(void);
int cli_stop_signal(void);
/* How many of them arrived. */
int cli_stop_signals(void);
/* Raises the soft descriptor limit to the hard one (servers: every
 * connection is a descriptor). */
void cli_raise_fd_limit(void);
/* Options that take a value. */
typedef struct cli_opt {
    const char *name;
    const char **value;
} cli_opt;
/* If argv[*i] is in opts (ended by a NULL name), stores the next argument
 * in its value, advances *i and returns 1; 0 if it is not in the table; -1
 * after printing "skyloom CMD: OPT needs a value" (a usage error). */
int cli_opt_take(const char *cmd, int argc, char **argv, int *i, const cli_opt *opts);
/* The coordinator's address and the PKI directory from the environment:
 * the commands that take --coordinator or --pki use these where the option
 * is not given (an option on the command line wins). */
#define CLI_ENV_COORDINATOR "SKYLOOM_COORDINATOR"
#define CLI_ENV_PKI "SKYLOOM_PKI"
/* value when it is set, else the environment variable `env` when set and
 * not empty, else NULL. */
const char *cli_env_default(const char *value, const char *env);
/* 0 when both are set; else prints which is missing (and its variable) as
 * a usage error of `cmd` and returns 2. */
int cli_need_connection(const char *cmd, const char *target, const char *pki);
/* A coordinator's address as --coordinator (or opt) takes it: HOST:PORT,
 * [ADDR]:PORT for IPv6, a port from 1 to 65535 (gRPC's own forms, unix:,
 * dns:///, ipv4:, are passed on). A bare host is refused here instead of
 * being dialled at a port it does not name. */
int cli_check_address(const char *opt, const char *target, sl_err *err);
/* A failed call to the coordinator at `target`, as the message in err
 * (returns -1): the common mistakes in words (nothing listening there; a
 * server that is not the coordinator's gRPC port: its HTTP dashboard, which
 * a plain HTTP request to it tells, or anything else that fails the TLS
 * handshake; a coordinator whose certificate the CA of `pki` did not sign;
 * a host name that does not resolve), anything else as "TARGET: CODE:
 * details". */
int cli_call_error(sl_err *err, const char *target, const char *pki, int code, const char *details);
/* 0 when a failed call's reason will not change by calling again (a TLS
 * handshake refused, a certificate from another CA, a host name that does
 * not resolve); 1 otherwise (nothing listening yet, a restart, a timeout). */
int cli_call_may_pass(int code, const char *details);
/* --model as a folder (job export's, or Hugging Face's layout): when
 * *model is a directory, it becomes DIR/model.safetensors, and *config
 * (when not given) DIR/config.json, *vocab (when vocab is not NULL and not
 * given) DIR/vocab.txt where there is one, and *cased (when not NULL and
 * not set) 1 where DIR/tokenizer_config.json says do_lower_case false. The
 * paths live in f. */
typedef struct cli_model_dir {
    char model[4200], config[4200], vocab[4200];
} cli_model_dir;
void cli_model_folder(cli_model_dir *f, const char **model, const char **config, const char **vocab,
                      int *cased);
int cmd_plan(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
/* skyloom eval --task classify (cmd_eval_classify.c), with eval's options. */
typedef struct cli_eval_args {
    const char *config, *model, *data, *device;
    const char *precision; /* fp32 or bf16, checked */
    const char *logits;    /* --logits FILE or NULL */
    int batches;           /* 0: every sequence from first to the end */
    int B, json;
    int64_t first, seed;
} cli_eval_args;
int cmd_eval_classify(const cli_eval_args *a);
int cmd_fill_mask(int argc, char **argv);
int cmd_predict(int argc, char **argv);
/* The ids of text as Hugging Face's BertTokenizer gives them: [MASK],
 * [CLS], [SEP], [PAD] and [UNK] written in the text are those tokens (when
 * the vocabulary has them), the rest goes through the tokenizer; appended
 * to out (no [CLS]/[SEP] around it). */
int cli_encode_text(const dev_vocab *v, int cased, const char *text, dev_ids *out, sl_err *err);

#endif
