/* cli_util.c - what the commands share: "--name value" options from a
 * table, stopping on SIGINT/SIGTERM, the coordinator's address and PKI from
 * the environment, and a failed call to the coordinator in words. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "rpc.h"
#include "sl_log.h"
#include "sl_time.h"

int cli_opt_take(const char *cmd, int argc, char **argv, int *i, const cli_opt *opts)
{
    for (const cli_opt *o = opts; o->name; o++) {
        if (strcmp(argv[*i], o->name) != 0)
            continue;
        if (*i + 1 >= argc) {
            sl_cli_fail(cmd, 2, "%s needs a value", o->name);
            return -1;
        }
        *o->value = argv[++*i];
        return 1;
    }
    return 0;
}

static volatile sig_atomic_t stop_flag, stop_count;
static void on_signal(int sig)
{
    stop_flag = sig;
    if (stop_count < 1000)
        stop_count++;
}

int cli_stop_signals(void) { return stop_count; }

void cli_catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cli_stop_signal(void) { return stop_flag; }

void cli_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t was = rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    sl_log_debug("descriptor limit", "soft=%llu hard=%llu was=%llu",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                 (unsigned long long)was);
}

const char *cli_env_default(const char *value, const char *env)
{
    if (value)
        return value;
    const char *e = getenv(env);
    return e && *e ? e : NULL;
}

int cli_need_connection(const char *cmd, const char *target, const char *pki)
{
    if (!target && !pki)
        return sl_cli_fail(cmd, 2, "--coordinator and --pki are required (or the environment "
                           "variables %s and %s)", CLI_ENV_COORDINATOR, CLI_ENV_PKI);
    if (!target || !pki)
        return sl_cli_fail(cmd, 2, "%s is required (or the environment variable %s)",
                           target ? "--pki" : "--coordinator",
                           target ? CLI_ENV_PKI : CLI_ENV_COORDINATOR);
    return 0;
}

int cli_check_address(const char *opt, const char *target, sl_err *err)
{
    /* gRPC's own forms (unix:PATH, dns:///HOST:PORT, ipv4:...) are its to check */
    if (strstr(target, "://") || !strncmp(target, "unix:", 5) || !strncmp(target, "ipv4:", 5) ||
        !strncmp(target, "ipv6:", 5))
        return 0;
    const char *colon = strrchr(target, ':');
    const char *close = strrchr(target, ']');
    int v6 = target[0] == '[';
    if (!colon || (v6 && (!close || colon < close)) || (!v6 && strchr(target, ':') != colon))
        return sl_err_set(err, SL_EINVAL, "%s %s has no port: give HOST:PORT (the coordinator's "
                          "--listen port, 7400 in the docs; [ADDR]:PORT for IPv6)", opt, target);
    if (colon == target || (v6 && close != colon - 1))
        return sl_err_set(err, SL_EINVAL, "%s %s: give HOST:PORT", opt, target);
    const char *port = colon + 1;
    char *end;
    long p = strtol(port, &end, 10);
    if (!*port || *end || p < 1 || p > 65535 || !isdigit((unsigned char)*port))
        return sl_err_set(err, SL_EINVAL, "%s %s: the port '%s' is not a number from 1 to 65535",
                          opt, target, port);
    return 0;
}

/* 1 if the server at target answers a plain HTTP request as HTTP (within a
 * second or two), 0 otherwise. */
static int speaks_http(const char *target)
{
    char host[256];
    const char *colon = strrchr(target, ':');
    if (!colon || (size_t)(colon - target) >= sizeof host)
        return 0;
    const char *h = target;
    size_t hl = (size_t)(colon - target);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
        return 0;
    int yes = 0, fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS)) {
        static const char req[] = "GET / HTTP/1.0\r\n\r\n";
        char got[5];
        size_t sent = 0, n = 0;
        double end = sl_now_s() + 2;
        while (n < sizeof got && sl_now_s() < end) {
            struct pollfd pf = {fd, sent < sizeof req - 1 ? POLLOUT : POLLIN, 0};
            if (poll(&pf, 1, 100) < 0 && errno != EINTR)
                break;
            if (pf.revents & POLLOUT) {
                ssize_t k = send(fd, req + sent, sizeof req - 1 - sent, MSG_NOSIGNAL);
                if (k < 0 && errno != EAGAIN)
                    break;
                sent += k > 0 ? (size_t)k : 0;
            } else if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t k = recv(fd, got + n, sizeof got - n, 0);
                if (k <= 0 && !(k < 0 && errno == EAGAIN))
                    break;
                n += k > 0 ? (size_t)k : 0;
            }
        }
        yes = n == sizeof got && !memcmp(got, "HTTP/", 5);
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return yes;
}

/* The OpenSSL reason in a gRPC handshake error ("... SSL routines::wrong
 * version number"), or "" */
static void ssl_reason(const char *details, char *out, size_t n)
{
    const char *r = strstr(details, "routines::");
    snprintf(out, n, "%s", r ? r + 10 : "");
}

int cli_call_may_pass(int code, const char *details)
{
    return !(code == RPC_UNAVAILABLE &&
             (strstr(details, "certificate verify failed") || strstr(details, "andshake") ||
              strstr(details, "DNS resolution failed")));
}

int cli_call_error(sl_err *err, const char *target, const char *pki, int code, const char *details)
{
    static const char ports[] = "--coordinator is the coordinator's gRPC address (its --listen, "
                                "7400 in the docs), not its HTTP dashboard's (--http-listen, 7401)";
    if (code == RPC_UNAVAILABLE) {
        char why[128];
        if (strstr(details, "certificate verify failed"))
            return sl_err_set(err, SL_EAUTH, "the coordinator at %s has a certificate that is not "
                              "signed by the CA of --pki %s (%s/ca.crt): is %s the PKI this "
                              "coordinator was started with?", target, pki, pki, pki);
        int closed = strstr(details, "Socket closed") || strstr(details, "Connection reset");
        if ((strstr(details, "andshake") || closed) && speaks_http(target))
            return sl_err_set(err, SL_EIO, "%s is an HTTP server (the coordinator's dashboard?), "
                              "not a coordinator: %s", target, ports);
        if (strstr(details, "andshake") || closed) {
            ssl_reason(details, why, sizeof why);
            return sl_err_set(err, SL_EIO, "%s answers, but not as a coordinator (%s%s%s): %s",
                              target, closed ? "it closed the connection" : "the TLS handshake "
                              "failed", why[0] ? ": " : "", why, ports);
        }
        if (strstr(details, "Connection refused"))
            return sl_err_set(err, SL_EIO, "cannot reach the coordinator at %s (connection "
                              "refused): is it running? %s", target, ports);
        if (strstr(details, "DNS resolution failed"))
            return sl_err_set(err, SL_EIO, "cannot reach the coordinator at %s: its host name "
                              "does not resolve", target);
    }
    return sl_err_set(err, code == RPC_NOT_FOUND ? SL_EINVAL : SL_EIO, "%s: %s: %s", target,
                      rpc_code_name(code), details);
}

int cli_encode_text(const dev_vocab *v, int cased, const char *text, dev_ids *out, sl_err *err)
{
    static const char *const special[] = {"[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]"};
    const char *p = text;
    for (;;) {
        const char *best = NULL;
        int id = -1;
        size_t blen = 0;
        for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) {
            int sid = dev_vocab_id(v, special[k]);
            const char *q = sid >= 0 ? strstr(p, special[k]) : NULL;
            if (q && (!best || q < best)) {
                best = q;
                id = sid;
                blen = strlen(special[k]);
            }
        }
        size_t n = best ? (size_t)(best - p) : strlen(p);
        if (dev_tok_encode(v, cased, p, n, out, err))
            return -1;
        if (!best)
            return 0;
        dev_ids_push(out, id);
        p = best + blen;
    }
}

void cli_model_folder(cli_model_dir *f, const char **model, const char **config, const char **vocab,
                      int *cased)
{
    struct stat sb;
    if (!*model || stat(*model, &sb) || !S_ISDIR(sb.st_mode))
        return;
    const char *dir = *model;
    snprintf(f->config, sizeof f->config, "%s/config.json", dir);
    snprintf(f->vocab, sizeof f->vocab, "%s/vocab.txt", dir);
    char tc[4300];
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    if (!*config)
        *config = f->config;
    if (vocab && !*vocab && access(f->vocab, F_OK) == 0)
        *vocab = f->vocab;
    json_error_t je;
    json_t *t = cased && !*cased ? json_load_file(tc, 0, &je) : NULL;
    if (t && json_is_false(json_object_get(t, "do_lower_case")))
        *cased = 1;
    json_decref(t);
    snprintf(f->model, sizeof f->model, "%s/model.safetensors", dir);
    *model = f->model;
}

static int by_score(const void *a, const void *b)
{
    const cli_scored *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

void cli_softmax_ranked(const float *logits, int n, cli_scored *out)
{
    double mx = logits[0], sum = 0;
    for (int k = 1; k < n; k++)
        mx = logits[k] > mx ? logits[k] : mx;
    for (int k = 0; k < n; k++)
        sum += exp((double)logits[k] - mx);
    for (int k = 0; k < n; k++)
        out[k] = (cli_scored){k, exp((double)logits[k] - mx) / sum};
    qsort(out, (size_t)n, sizeof *out, by_score);
}
