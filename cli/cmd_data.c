/* skyloom data: corpus -> WordPiece vocabulary -> token shards.
 *   skyloom data vocab --corpus FILE... --size N --out vocab.txt [--cased]
 *   skyloom data prepare --vocab vocab.txt --in FILE_OR_DIR... --out SHARD --seq T [--cased]
 *                        [--labels [--label-vocab labels.txt]]
 *   skyloom data inspect SHARD [--json] [--show N]
 *   skyloom data tokenize --vocab vocab.txt [--cased] [FILE...] */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "sl_file.h"
#include "dev_labels.h"
#include "dev_shard.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

#define MAX_CORPUS_FILE ((uint64_t)4 << 30)

/* One usage text per data command: `skyloom data CMD --help` prints CMD's,
 * `skyloom data --help` all of them. */
static const struct data_cmd {
    const char *name, *synopsis, *text;
} data_cmds[] = {
    {"vocab",
     "skyloom data vocab --corpus FILE... --size N --out vocab.txt [--cased]\n"
     "                          [--min-freq K] [--json]",
     "  vocab    learns a WordPiece vocabulary (standard vocab.txt, '##' pieces)\n"},
    {"prepare",
     "skyloom data prepare --vocab vocab.txt --in FILE_OR_DIR... --out SHARD\n"
     "                          --seq T [--cased] [--labels [--label-vocab labels.txt]]\n"
     "                          [--json]",
     "  prepare  tokenizes (BERT BasicTokenizer + WordPiece) and packs documents into\n"
     "           [CLS] ... [SEP] sequences of at most T tokens, written as one shard.\n"
     "           With --labels the input is labelled text for sequence classification:\n"
     "           LABEL<TAB>TEXT lines, or JSON lines {\"label\": ..., \"text\": ...} (a\n"
     "           file whose first line starts with '{'); each example is one sequence\n"
     "           [CLS] text [SEP], cut to T tokens, with its class. The labels are\n"
     "           --label-vocab's (one per line; a label not in it is an error), or\n"
     "           those found in the input, sorted (numerically when all are numbers),\n"
     "           written to labels.txt beside the shard (an existing different one is\n"
     "           an error: pass it as --label-vocab). The shard stores them\n"},
    {"inspect", "skyloom data inspect SHARD [--show N] [--json]",
     "  inspect  shows a shard's header, counts, vocabulary hash and first sequences\n"},
    {"tokenize", "skyloom data tokenize --vocab vocab.txt [--cased] [FILE...]",
     "  tokenize prints one line of WordPiece ids per input line (no [CLS]/[SEP]),\n"
     "           reading the FILEs in order ('-' or none: standard input)\n"},
};
#define N_DATA_CMDS (int)(sizeof data_cmds / sizeof data_cmds[0])

/* All the data commands (only NULL), or the one named "data NAME". */
static void usage_data(FILE *f, const char *only)
{
    const struct data_cmd *one = NULL;
    for (int i = 0; only && i < N_DATA_CMDS; i++)
        if (!strcmp(only + strlen("data "), data_cmds[i].name))
            one = &data_cmds[i];
    int k = 0;
    for (int i = 0; i < N_DATA_CMDS; i++)
        if (!one || one == &data_cmds[i])
            fprintf(f, "%s %s\n", k++ ? "      " : "usage:", data_cmds[i].synopsis);
    fprintf(f, "\n%s", one ? "" : "Turns UTF-8 text into what BERT pre-training reads.\n");
    for (int i = 0; i < N_DATA_CMDS; i++)
        if (!one || one == &data_cmds[i])
            fputs(data_cmds[i].text, f);
    if (!one || strcmp(one->name, "inspect"))
        fprintf(f, "\nCorpus text: one sentence or paragraph per line, a blank line between "
                   "documents;\na directory stands for all files under it (sorted). Text is "
                   "lower-cased and\naccent-stripped unless --cased. Invalid UTF-8 is an error "
                   "naming file and offset.\n");
}

/* ---- corpus files ---- */
typedef struct paths {
    char **p;
    size_t n, cap;
} paths;

static void paths_add(paths *ps, const char *p)
{
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? ps->cap * 2 : 16;
        ps->p = sl_xrealloc(ps->p, ps->cap * sizeof *ps->p);
    }
    ps->p[ps->n++] = sl_xstrdup(p);
}

static void paths_free(paths *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        free(ps->p[i]);
    free(ps->p);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds path, or every regular file under it (sorted, dot files skipped). */
static int expand(paths *out, const char *path, int depth, sl_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return sl_err_set(err, SL_EIO, "%s: no such file or directory", path);
    if (!S_ISDIR(st.st_mode)) {
        paths_add(out, path);
        return 0;
    }
    if (depth > 32)
        return sl_err_set(err, SL_EINVAL, "%s: directories nested too deep", path);
    DIR *d = opendir(path);
    if (!d)
        return sl_err_set(err, SL_EIO, "%s: cannot open directory", path);
    paths sub = {0};
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            size_t n = strlen(path) + strlen(e->d_name) + 2;
            char *p = sl_xmalloc(n);
            snprintf(p, n, "%s/%s", path, e->d_name);
            paths_add(&sub, p);
            free(p);
        }
    closedir(d);
    qsort(sub.p, sub.n, sizeof *sub.p, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < sub.n && !rc; i++)
        rc = expand(out, sub.p[i], depth + 1, err);
    paths_free(&sub);
    return rc;
}

/* Reads a corpus file and checks it is UTF-8 (error: file, offset, line). */
static int read_text(const char *path, char **buf, size_t *len, sl_err *err)
{
    if (sl_read_file(path, MAX_CORPUS_FILE, buf, len, err))
        return -1;
    size_t bad = dev_utf8_check(*buf, *len);
    if (bad < *len) {
        size_t line = 1;
        for (size_t i = 0; i < bad; i++)
            line += (*buf)[i] == '\n';
        free(*buf);
        return sl_err_set(err, SL_EINVAL, "%s: invalid UTF-8 at byte offset %zu (line %zu)", path,
                          bad, line);
    }
    return 0;
}

/* Options of the data subcommands, parsed from a table. */
typedef struct dopt {
    const char *name;
    char kind; /* 'f' flag, 'i' integer in [min, max], 's' string, 'l' one or more values */
    void *dst; /* int*, int*, const char**, paths* */
    int min, max;
} dopt;

/* Returns 0, or the exit status to return now: 0 after --help, 2 after a
 * usage error (printed). Arguments that are not options go to *pos. */
static int parse_opts(const char *cmd, int argc, char **argv, const dopt *opts, paths *pos,
                      int *done)
{
    *done = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_data(stdout, cmd);
            return 0;
        }
        const dopt *o = opts;
        while (o->name && strcmp(o->name, a))
            o++;
        if (!o->name) {
            if (a[0] == '-' && a[1])
                return sl_cli_fail(cmd, 2, "unknown option '%s'", a);
            if (!pos)
                return sl_cli_fail(cmd, 2, "unexpected argument '%s'", a);
            paths_add(pos, a);
            continue;
        }
        if (o->kind == 'f') {
            *(int *)o->dst = 1;
            continue;
        }
        if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
            return sl_cli_fail(cmd, 2, "%s needs a value", a);
        if (o->kind == 'l') {
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                paths_add(o->dst, argv[++i]);
        } else if (o->kind == 's') {
            *(const char **)o->dst = argv[++i];
        } else {
            sl_err err = {0};
            if (sl_parse_int(a, argv[++i], o->min, o->max, o->dst, &err))
                return sl_cli_fail(cmd, 2, "%s", err.msg);
        }
    }
    *done = 0;
    return 0;
}

static void print_json(json_t *o)
{
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    printf("%s\n", s);
    free(s);
    json_decref(o);
}

/* ---- vocab ---- */
static int data_vocab(int argc, char **argv)
{
    paths corpus = {0};
    const char *out = NULL;
    int size = 0, min_freq = 2, cased = 0, json = 0;
    sl_err err = {0};
    const dopt opts[] = {{"--corpus", 'l', &corpus, 0, 0},
                         {"--size", 'i', &size, 6, DEV_VOCAB_MAX_SIZE},
                         {"--min-freq", 'i', &min_freq, 1, 1 << 30},
                         {"--out", 's', &out, 0, 0},
                         {"--cased", 'f', &cased, 0, 0},
                         {"--json", 'f', &json, 0, 0},
                         {NULL, 0, NULL, 0, 0}};
    int stop, rc = parse_opts("data vocab", argc, argv, opts, NULL, &stop);
    if (stop)
        goto done;
    rc = 2;
    if (!corpus.n || !size || !out) {
        sl_cli_fail("data vocab", 2, "--corpus, --size and --out are required");
        goto done;
    }
    rc = 1;
    double t0 = sl_now_s();
    paths files = {0};
    for (size_t i = 0; i < corpus.n; i++)
        if (expand(&files, corpus.p[i], 0, &err)) {
            paths_free(&files);
            sl_cli_fail("data vocab", 1, "%s", err.msg);
            goto done;
        }
    dev_wordcount *wc = dev_wordcount_new(cased);
    uint64_t bytes = 0;
    for (size_t i = 0; i < files.n; i++) {
        char *buf = NULL;
        size_t len = 0;
        int bad = read_text(files.p[i], &buf, &len, &err);
        if (!bad && dev_wordcount_add(wc, buf, len, &err)) {
            sl_err_wrap(&err, "%s", files.p[i]);
            bad = 1;
            free(buf);
        }
        if (bad) {
            sl_cli_fail("data vocab", 1, "%s", err.msg);
            dev_wordcount_free(wc);
            paths_free(&files);
            goto done;
        }
        bytes += len;
        free(buf);
    }
    dev_vocab_learned L;
    if (dev_vocab_learn(wc, size, min_freq, &L, &err)) {
        sl_cli_fail("data vocab", 1, "%s", err.msg);
        dev_wordcount_free(wc);
        paths_free(&files);
        goto done;
    }
    if (sl_write_file_atomic(out, L.text, L.len, &err)) {
        sl_cli_fail("data vocab", 1, "%s", err.msg);
    } else {
        dev_vocab *v = dev_vocab_parse(L.text, L.len, out, &err);
        uint8_t h[32];
        char hex[65] = "";
        if (v) {
            dev_vocab_hash(v, h);
            dev_hash_hex(h, hex);
        }
        double dt = sl_now_s() - t0;
        if (json) {
            print_json(json_pack("{s:s, s:i, s:i, s:i, s:I, s:I, s:I, s:s, s:b, s:f}", "out", out,
                                 "tokens", L.ntokens, "alphabet", L.alphabet, "dropped_chars",
                                 L.dropped_chars, "files", (json_int_t)files.n, "bytes",
                                 (json_int_t)bytes, "unique_words",
                                 (json_int_t)dev_wordcount_unique(wc), "vocab_hash", hex,
                                 "cased", cased, "seconds", dt));
        } else {
            printf("wrote %s: %d tokens (%d characters, %d merges) from %zu file(s), %llu bytes, "
                   "%zu distinct words in %.2f s\nvocabulary hash %s\n",
                   out, L.ntokens, L.alphabet,
                   L.ntokens - L.alphabet - (size >= DEV_VOCAB_BERT_LAYOUT_MIN ? 104 : 5),
                   files.n, (unsigned long long)bytes, dev_wordcount_unique(wc), dt, hex);
            if (L.ntokens < size)
                printf("note: only %d tokens: no pair occurs %d times any more (--min-freq)\n",
                       L.ntokens, min_freq);
            if (L.dropped_chars)
                printf("note: %d rare characters left out (they tokenize as [UNK])\n",
                       L.dropped_chars);
        }
        dev_vocab_free(v);
        rc = 0;
    }
    free(L.text);
    dev_wordcount_free(wc);
    paths_free(&files);
done:
    paths_free(&corpus);
    return rc;
}

/* Warns when the vocabulary's case does not match the mode (a cased vocab
 * used uncased never sees its capitalised tokens, and the reverse gives [UNK]s). */
static void check_case(const dev_vocab *v, int cased)
{
    int upper = 0;
    for (int i = 0; i < dev_vocab_size(v) && !upper; i++) {
        const char *t = dev_vocab_token(v, i);
        if (t[0] == '[')
            continue;
        for (const char *c = t; *c; c++)
            if (*c >= 'A' && *c <= 'Z') {
                upper = 1;
                break;
            }
    }
    if (upper && !cased)
        sl_log_warn("vocabulary has upper-case tokens but --cased was not given", "%s", "");
    if (!upper && cased)
        sl_log_warn("--cased given but the vocabulary has no upper-case tokens", "%s", "");
}

/* ---- prepare ---- */
static int prepare_file(dev_shard_writer *w, const dev_vocab *v, int cased, const char *path,
                        uint64_t *bytes, sl_err *err)
{
    char *buf;
    size_t len;
    if (read_text(path, &buf, &len, err))
        return -1;
    dev_ids ids = {0};
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len;
        bool blank = true;
        for (size_t k = i; k < e && blank; k++)
            blank = buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r';
        if (blank) {
            dev_shard_writer_end_doc(w);
        } else {
            ids.n = 0;
            if (dev_tok_encode(v, cased, buf + i, e - i, &ids, err)) {
                sl_err_wrap(err, "%s", path);
                free(buf);
                dev_ids_free(&ids);
                return -1;
            }
            dev_shard_writer_sentence(w, ids.v, ids.n);
        }
        i = e + 1;
    }
    dev_shard_writer_end_doc(w);
    *bytes += len;
    dev_ids_free(&ids);
    free(buf);
    return 0;
}

static int prepare_labelled(const dev_vocab *v, const paths *files, const char *label_vocab,
                            int T, int cased, const char *out, int json, double t0, sl_err *err);

static int data_prepare(int argc, char **argv)
{
    paths in = {0};
    const char *out = NULL, *vpath = NULL, *label_vocab = NULL;
    int T = 0, cased = 0, json = 0, labelled = 0;
    sl_err err = {0};
    const dopt opts[] = {{"--in", 'l', &in, 0, 0},
                         {"--seq", 'i', &T, 3, DEV_SHARD_MAX_SEQ},
                         {"--vocab", 's', &vpath, 0, 0},
                         {"--out", 's', &out, 0, 0},
                         {"--cased", 'f', &cased, 0, 0},
                         {"--json", 'f', &json, 0, 0},
                         {"--labels", 'f', &labelled, 0, 0},
                         {"--label-vocab", 's', &label_vocab, 0, 0},
                         {NULL, 0, NULL, 0, 0}};
    int stop, rc = parse_opts("data prepare", argc, argv, opts, NULL, &stop);
    if (stop)
        goto done;
    rc = 2;
    if (!in.n || !vpath || !out || !T) {
        sl_cli_fail("data prepare", 2, "--vocab, --in, --out and --seq are required");
        goto done;
    }
    if (label_vocab && !labelled) {
        sl_cli_fail("data prepare", 2, "--label-vocab goes with --labels");
        goto done;
    }
    rc = 1;
    double t0 = sl_now_s();
    dev_vocab *v = dev_vocab_load(vpath, &err);
    if (!v) {
        sl_cli_fail("data prepare", 1, "%s", err.msg);
        goto done;
    }
    check_case(v, cased);
    paths files = {0};
    dev_shard_writer *w = NULL;
    uint64_t bytes = 0;
    if (labelled) {
        for (size_t i = 0; i < in.n; i++)
            if (expand(&files, in.p[i], 0, &err))
                goto fail;
        if (prepare_labelled(v, &files, label_vocab, T, cased, out, json, t0, &err))
            goto fail;
        rc = 0;
        goto cleanup;
    }
    w = dev_shard_writer_new(v, T, cased, &err);
    if (!w) {
        sl_err_wrap(&err, "%s", vpath);
        goto fail;
    }
    for (size_t i = 0; i < in.n; i++)
        if (expand(&files, in.p[i], 0, &err))
            goto fail;
    for (size_t i = 0; i < files.n; i++)
        if (prepare_file(w, v, cased, files.p[i], &bytes, &err))
            goto fail;
    uint64_t nseq = dev_shard_writer_count(w);
    if (dev_shard_writer_finish(w, out, &err))
        goto fail;
    double dt = sl_now_s() - t0;
    dev_shard *s = dev_shard_open(out, &err);
    if (!s)
        goto fail;
    uint8_t h[32];
    char hex[65];
    dev_shard_vocab_hash(s, h);
    dev_hash_hex(h, hex);
    if (json)
        print_json(json_pack("{s:s, s:I, s:I, s:I, s:I, s:i, s:I, s:s, s:f}", "out", out,
                             "sequences", (json_int_t)dev_shard_count(s), "documents",
                             (json_int_t)dev_shard_doc_count(s), "tokens",
                             (json_int_t)dev_shard_token_count(s), "files", (json_int_t)files.n,
                             "seq_len", T, "bytes", (json_int_t)bytes, "vocab_hash", hex,
                             "seconds", dt));
    else
        printf("wrote %s: %llu sequences of at most %d tokens, %llu documents, %llu tokens from "
               "%zu file(s), %llu bytes in %.2f s\nvocabulary hash %s\n",
               out, (unsigned long long)nseq, T, (unsigned long long)dev_shard_doc_count(s),
               (unsigned long long)dev_shard_token_count(s), files.n, (unsigned long long)bytes,
               dt, hex);
    dev_shard_close(s);
    rc = 0;
    goto cleanup;
fail:
    sl_cli_fail("data prepare", 1, "%s", err.msg);
cleanup:
    dev_shard_writer_free(w);
    paths_free(&files);
    dev_vocab_free(v);
done:
    paths_free(&in);
    return rc;
}

/* ---- labelled text: LABEL<TAB>TEXT or JSON lines ---- */

/* One example's label and text (not NUL-terminated), and where it is. */
typedef struct example {
    const char *label, *text;
    size_t label_len, text_len;
    const char *path;
    size_t line;
} example;
typedef int (*example_fn)(void *ud, const example *e, sl_err *err);

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

/* A JSON line's example: an object with "label" (a string, or an integer
 * standing for its decimal digits) and "text" (a string); other keys are
 * ignored. */
static int json_example(const char *line, size_t n, example *e, json_t **hold, char *num,
                        sl_err *err)
{
    json_error_t je;
    json_t *o = json_loadb(line, n, JSON_REJECT_DUPLICATES, &je);
    *hold = o;
    if (!o)
        return sl_err_set(err, SL_EINVAL, "%s:%zu: bad JSON: %s", e->path, e->line, je.text);
    if (!json_is_object(o))
        return sl_err_set(err, SL_EINVAL, "%s:%zu: not a JSON object {\"label\": ..., \"text\": ...}",
                          e->path, e->line);
    json_t *l = json_object_get(o, "label"), *t = json_object_get(o, "text");
    if (!l || !t)
        return sl_err_set(err, SL_EINVAL, "%s:%zu: no \"%s\"", e->path, e->line,
                          !l ? "label" : "text");
    if (json_is_integer(l)) {
        snprintf(num, 32, "%lld", (long long)json_integer_value(l));
        e->label = num;
        e->label_len = strlen(num);
    } else if (json_is_string(l)) {
        e->label = json_string_value(l);
        e->label_len = json_string_length(l);
    } else {
        return sl_err_set(err, SL_EINVAL, "%s:%zu: \"label\" must be a string or an integer",
                          e->path, e->line);
    }
    if (!json_is_string(t))
        return sl_err_set(err, SL_EINVAL, "%s:%zu: \"text\" must be a string", e->path, e->line);
    e->text = json_string_value(t);
    e->text_len = json_string_length(t);
    return 0;
}

/* Calls fn for every example of a labelled file, in order; blank lines are
 * skipped. A file is JSON lines when its first non-blank line starts with
 * '{', else LABEL<TAB>TEXT lines (the label trimmed of spaces). Errors name
 * the file and line. */
static int read_examples(const char *path, example_fn fn, void *ud, sl_err *err)
{
    char *buf;
    size_t len;
    if (read_text(path, &buf, &len, err))
        return -1;
    int json = -1, rc = 0;
    size_t line = 0;
    for (size_t i = 0; i < len && !rc;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e_ = nl ? (size_t)(nl - buf) : len;
        const char *p = buf + i;
        size_t n = e_ - i;
        i = e_ + 1;
        line++;
        if (blank(p, n))
            continue;
        if (n && p[n - 1] == '\r')
            n--;
        if (json < 0) {
            size_t k = 0;
            while (k < n && (p[k] == ' ' || p[k] == '\t'))
                k++;
            json = p[k] == '{';
        }
        example e = {.path = path, .line = line};
        json_t *hold = NULL;
        char num[32];
        if (json) {
            rc = json_example(p, n, &e, &hold, num, err);
        } else {
            const char *tab = memchr(p, '\t', n);
            if (!tab) {
                rc = sl_err_set(err, SL_EINVAL, "%s:%zu: no tab between the label and the text "
                                "(LABEL<TAB>TEXT)", path, line);
            } else {
                e.label = p;
                e.label_len = (size_t)(tab - p);
                while (e.label_len && e.label[0] == ' ')
                    e.label++, e.label_len--;
                while (e.label_len && e.label[e.label_len - 1] == ' ')
                    e.label_len--;
                e.text = tab + 1;
                e.text_len = n - (size_t)(tab + 1 - p);
            }
        }
        const char *why;
        if (!rc && !dev_label_ok(e.label, e.label_len, &why))
            rc = sl_err_set(err, SL_EINVAL, "%s:%zu: the label %s", path, line, why);
        if (!rc && blank(e.text, e.text_len))
            rc = sl_err_set(err, SL_EINVAL, "%s:%zu: empty text", path, line);
        if (!rc)
            rc = fn(ud, &e, err);
        json_decref(hold);
    }
    free(buf);
    return rc ? -1 : 0;
}

/* The labels found in the input (first pass without --label-vocab): a set
 * of names, open addressing over strdup'd strings. */
typedef struct label_set {
    char **slot;
    size_t cap, n;
    const dev_labels *given; /* --label-vocab: every label must be in it */
    const char *given_path;
} label_set;

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int collect_label(void *ud, const example *e, sl_err *err)
{
    label_set *ls = ud;
    if (ls->given) {
        if (dev_labels_find(ls->given, e->label, e->label_len) < 0)
            return sl_err_set(err, SL_EINVAL, "%s:%zu: label '%.*s' is not in %s (%d labels)",
                              e->path, e->line, e->label_len > 80 ? 80 : (int)e->label_len,
                              e->label, ls->given_path, dev_labels_count(ls->given));
        return 0;
    }
    if (2 * (ls->n + 1) > ls->cap) {
        size_t cap = ls->cap ? 2 * ls->cap : 64;
        char **slot = sl_xcalloc(cap, sizeof *slot);
        for (size_t i = 0; i < ls->cap; i++)
            if (ls->slot[i]) {
                size_t k = fnv(ls->slot[i], strlen(ls->slot[i])) & (cap - 1);
                while (slot[k])
                    k = (k + 1) & (cap - 1);
                slot[k] = ls->slot[i];
            }
        free(ls->slot);
        ls->slot = slot;
        ls->cap = cap;
    }
    size_t k = fnv(e->label, e->label_len) & (ls->cap - 1);
    for (; ls->slot[k]; k = (k + 1) & (ls->cap - 1))
        if (strlen(ls->slot[k]) == e->label_len && !memcmp(ls->slot[k], e->label, e->label_len))
            return 0;
    if (ls->n >= DEV_LABELS_MAX)
        return sl_err_set(err, SL_EINVAL, "%s:%zu: more than %d distinct labels", e->path,
                          e->line, DEV_LABELS_MAX);
    ls->slot[k] = sl_xmalloc(e->label_len + 1);
    memcpy(ls->slot[k], e->label, e->label_len);
    ls->slot[k][e->label_len] = 0;
    ls->n++;
    return 0;
}

/* Second pass: each example tokenized into the shard with its class. */
typedef struct example_sink {
    dev_shard_writer *w;
    const dev_vocab *v;
    const dev_labels *labels;
    int cased;
    dev_ids ids;
    uint64_t cut;
} example_sink;

static int write_example(void *ud, const example *e, sl_err *err)
{
    example_sink *k = ud;
    k->ids.n = 0;
    if (dev_tok_encode(k->v, k->cased, e->text, e->text_len, &k->ids, err))
        return sl_err_wrap(err, "%s:%zu", e->path, e->line);
    if (k->ids.n == 0)
        return sl_err_set(err, SL_EINVAL, "%s:%zu: empty text (no tokens)", e->path, e->line);
    int id = dev_labels_find(k->labels, e->label, e->label_len);
    k->cut += (uint64_t)dev_shard_writer_example(k->w, k->ids.v, k->ids.n, id);
    return 0;
}

/* labels.txt beside the shard (its path in `path`): written (unless
 * check_only), or left as it is when it holds these labels already; another
 * one is an error (its ids would differ). */
static int write_label_vocab(const dev_labels *l, const char *out, int check_only, char *path,
                             size_t cap, sl_err *err)
{
    const char *slash = strrchr(out, '/');
    if (slash)
        snprintf(path, cap, "%.*s/labels.txt", (int)(slash - out), out);
    else
        snprintf(path, cap, "labels.txt");
    size_t len;
    const char *text = dev_labels_text(l, &len);
    if (access(path, F_OK) == 0) {
        sl_err e2 = {0};
        dev_labels *old = dev_labels_load(path, &e2);
        uint8_t a[32], b[32];
        int same = old != NULL;
        if (old) {
            dev_labels_hash(old, a);
            dev_labels_hash(l, b);
            same = !memcmp(a, b, 32);
        }
        dev_labels_free(old);
        if (same)
            return 0;
        return sl_err_set(err, SL_EINVAL, "%s exists with other labels than this input's; pass "
                          "--label-vocab %s to use its labels (and their ids), or remove it",
                          path, path);
    }
    return check_only ? 0 : sl_write_file_atomic(path, text, len, err);
}

static void free_set(label_set *ls)
{
    for (size_t i = 0; i < ls->cap; i++)
        free(ls->slot[i]);
    free(ls->slot);
}

/* prepare --labels: the examples of `files` into a labelled shard. */
static int prepare_labelled(const dev_vocab *v, const paths *files, const char *label_vocab,
                            int T, int cased, const char *out, int json, double t0, sl_err *err)
{
    label_set ls = {0};
    dev_labels *labels = NULL;
    dev_shard_writer *w = NULL;
    example_sink sink = {.v = v, .cased = cased};
    char lpath[4200];
    int rc = -1;
    if (label_vocab) {
        if (!(labels = dev_labels_load(label_vocab, err)))
            goto out;
        ls.given = labels;
        ls.given_path = label_vocab;
        snprintf(lpath, sizeof lpath, "%s", label_vocab);
    }
    for (size_t i = 0; i < files->n; i++)
        if (read_examples(files->p[i], collect_label, &ls, err))
            goto out;
    if (!labels) {
        const char **names = sl_xmalloc((ls.n + 1) * sizeof *names);
        size_t k = 0;
        for (size_t i = 0; i < ls.cap; i++)
            if (ls.slot[i])
                names[k++] = ls.slot[i];
        labels = dev_labels_from(names, (int)k, 1, "the input's labels", err);
        free(names);
        if (!labels) {
            if (k < 2)
                sl_err_set(err, SL_EINVAL, "the input has %zu distinct label%s; a classification "
                           "needs 2 or more (or --label-vocab with them all)", k, k == 1 ? "" : "s");
            goto out;
        }
    }
    if (!(w = dev_shard_writer_labelled(v, T, cased, labels, err)))
        goto out;
    sink.w = w;
    sink.labels = labels;
    uint64_t bytes = 0;
    for (size_t i = 0; i < files->n; i++) {
        struct stat st;
        if (read_examples(files->p[i], write_example, &sink, err))
            goto out;
        if (stat(files->p[i], &st) == 0)
            bytes += (uint64_t)st.st_size;
    }
    uint64_t nseq = dev_shard_writer_count(w);
    if ((!label_vocab && write_label_vocab(labels, out, 1, lpath, sizeof lpath, err)) ||
        dev_shard_writer_finish(w, out, err) ||
        (!label_vocab && write_label_vocab(labels, out, 0, lpath, sizeof lpath, err)))
        goto out;
    double dt = sl_now_s() - t0;
    uint8_t h[32], lh[32];
    char hex[65], lhex[65];
    dev_vocab_hash(v, h);
    dev_hash_hex(h, hex);
    dev_labels_hash(labels, lh);
    dev_hash_hex(lh, lhex);
    int K = dev_labels_count(labels);
    if (json)
        print_json(json_pack("{s:s, s:I, s:i, s:s, s:s, s:I, s:I, s:i, s:I, s:s, s:s, s:f}", "out",
                             out, "sequences", (json_int_t)nseq, "labels", K, "label_vocab", lpath,
                             "label_vocab_source", label_vocab ? "given" : "input", "truncated",
                             (json_int_t)sink.cut, "files", (json_int_t)files->n, "seq_len", T,
                             "bytes", (json_int_t)bytes, "vocab_hash", hex, "label_hash", lhex,
                             "seconds", dt));
    else
        printf("wrote %s: %llu labelled sequences of at most %d tokens (%llu cut to fit), %d "
               "labels, from %zu file(s), %llu bytes in %.2f s\nlabels %s (%s), hash %s\n"
               "vocabulary hash %s\n",
               out, (unsigned long long)nseq, T, (unsigned long long)sink.cut, K, files->n,
               (unsigned long long)bytes, dt, lpath, label_vocab ? "given" : "from the input",
               lhex, hex);
    rc = 0;
out:
    free_set(&ls);
    dev_labels_free(labels);
    dev_shard_writer_free(w);
    dev_ids_free(&sink.ids);
    return rc;
}

/* ---- inspect ---- */
static int data_inspect(int argc, char **argv)
{
    int json = 0, show = 3;
    sl_err err = {0};
    paths pos = {0};
    const dopt opts[] = {{"--json", 'f', &json, 0, 0},
                         {"--show", 'i', &show, 0, 1000000},
                         {NULL, 0, NULL, 0, 0}};
    int stop, rc = parse_opts("data inspect", argc, argv, opts, &pos, &stop);
    if (!stop && pos.n != 1)
        rc = sl_cli_fail("data inspect", 2, pos.n ? "one shard at a time" :
                         "which shard? usage: skyloom data inspect SHARD");
    char path[4096];
    snprintf(path, sizeof path, "%s", pos.n ? pos.p[0] : "");
    paths_free(&pos);
    if (stop || rc)
        return rc;
    dev_shard *s = dev_shard_open(path, &err);
    if (!s)
        return sl_cli_fail("data inspect", 1, "%s", err.msg);
    dev_vocab *v = dev_shard_vocab(s, &err);
    if (!v) {
        dev_shard_close(s);
        return sl_cli_fail("data inspect", 1, "%s", err.msg);
    }
    int T = dev_shard_seq_len(s);
    uint64_t n = dev_shard_count(s);
    uint8_t h[32];
    char hex[65];
    dev_shard_vocab_hash(s, h);
    dev_hash_hex(h, hex);
    dev_special sp = dev_shard_special(s);
    int width = dev_shard_vocab_size(s) <= 65536 ? 2 : 4;
    double fill = (double)dev_shard_token_count(s) / ((double)n * T);
    int32_t *tok = sl_xmalloc((size_t)T * sizeof *tok);
    uint64_t nshow = (uint64_t)show < n ? (uint64_t)show : n;
    /* a labelled shard: the sequences of each class */
    const dev_labels *labels = dev_shard_labels(s);
    int K = labels ? dev_labels_count(labels) : 0;
    uint64_t *per = sl_xcalloc((size_t)K + 1, sizeof *per);
    for (uint64_t i = 0; labels && i < n; i++)
        per[dev_shard_label(s, i)]++;
    char lhex[65] = "";
    if (labels) {
        uint8_t lh[32];
        dev_labels_hash(labels, lh);
        dev_hash_hex(lh, lhex);
    }
    if (json) {
        json_t *seqs = json_array();
        uint64_t doc = 0;
        for (uint64_t i = 0; i < nshow; i++) {
            int len = dev_shard_read(s, i, tok);
            while (doc + 1 < dev_shard_doc_count(s) && dev_shard_doc_start(s, doc + 1) <= i)
                doc++;
            json_t *ids = json_array();
            for (int t = 0; t < len; t++)
                json_array_append_new(ids, json_integer(tok[t]));
            char *text = dev_tok_decode(v, tok, (size_t)len);
            json_t *row = json_pack("{s:I, s:I, s:i, s:o, s:s}", "index", (json_int_t)i,
                                    "document", (json_int_t)doc, "length", len, "ids", ids,
                                    "text", text);
            if (labels) {
                int c = dev_shard_label(s, i);
                json_object_set_new(row, "label", json_string(dev_labels_name(labels, c)));
                json_object_set_new(row, "class", json_integer(c));
            }
            json_array_append_new(seqs, row);
            free(text);
        }
        json_t *lj = NULL;
        if (labels) {
            json_t *names = json_array(), *counts = json_array();
            for (int c = 0; c < K; c++) {
                json_array_append_new(names, json_string(dev_labels_name(labels, c)));
                json_array_append_new(counts, json_integer((json_int_t)per[c]));
            }
            lj = json_pack("{s:i, s:s, s:o, s:o}", "count", K, "hash", lhex, "names", names,
                           "sequences", counts);
        }
        print_json(json_pack(
            "{s:s, s:i, s:i, s:i, s:s, s:b, s:i, s:I, s:I, s:I, s:f, s:{s:i, s:i, s:i, s:i, s:i}, s:o, s:o?}",
            "path", path, "version", dev_shard_version(s), "token_width", width, "vocab_size",
            dev_shard_vocab_size(s), "vocab_hash", hex, "cased", dev_shard_cased(s), "seq_len", T,
            "sequences", (json_int_t)n, "documents", (json_int_t)dev_shard_doc_count(s), "tokens",
            (json_int_t)dev_shard_token_count(s), "fill", fill, "special", "pad", sp.pad, "unk",
            sp.unk, "cls", sp.cls, "sep", sp.sep, "mask", sp.mask, "first", seqs, "labels", lj));
    } else {
        printf("shard:       %s\n", path);
        printf("format:      version %d, %d-byte token ids, checksum ok\n", dev_shard_version(s),
               width);
        printf("vocabulary:  %d tokens, %s, hash %s\n", dev_shard_vocab_size(s),
               dev_shard_cased(s) ? "cased" : "uncased", hex);
        printf("sequences:   %llu of at most %d tokens (%llu tokens, %.1f%% full)\n",
               (unsigned long long)n, T, (unsigned long long)dev_shard_token_count(s),
               100.0 * fill);
        printf("documents:   %llu\n", (unsigned long long)dev_shard_doc_count(s));
        printf("special ids: [PAD]=%d [UNK]=%d [CLS]=%d [SEP]=%d [MASK]=%d\n", sp.pad, sp.unk,
               sp.cls, sp.sep, sp.mask);
        if (labels) {
            printf("labels:      %d, hash %s; sequences per label:\n", K, lhex);
            for (int c = 0; c < K; c++)
                printf("  %5d  %-24s %10llu  %5.1f%%\n", c, dev_labels_name(labels, c),
                       (unsigned long long)per[c], 100.0 * (double)per[c] / (double)n);
        }
        for (uint64_t i = 0; i < nshow; i++) {
            int len = dev_shard_read(s, i, tok);
            char *text = dev_tok_decode(v, tok, (size_t)len);
            if (labels)
                printf("sequence %llu (%d tokens, label %s): %s\n", (unsigned long long)i, len,
                       dev_labels_name(labels, dev_shard_label(s, i)), text);
            else
                printf("sequence %llu (%d tokens): %s\n", (unsigned long long)i, len, text);
            free(text);
        }
    }
    free(per);
    free(tok);
    dev_vocab_free(v);
    dev_shard_close(s);
    return 0;
}

/* ---- tokenize ---- */
/* One output line of ids per input line of f; invalid UTF-8 stops with the
 * file's byte offset and line. */
static int tokenize_stream(const dev_vocab *v, int cased, FILE *f, const char *name, sl_err *err)
{
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    uint64_t off = 0;
    ssize_t n;
    dev_ids ids = {0};
    int rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)n;
        size_t bad = dev_utf8_check(line, len);
        if (bad < len) {
            rc = sl_err_set(err, SL_EINVAL, "%s: invalid UTF-8 at byte offset %llu (line %zu)",
                            name, (unsigned long long)(off + bad), lineno);
            break;
        }
        off += len;
        if (len && line[len - 1] == '\n')
            len--;
        ids.n = 0;
        if (dev_tok_encode(v, cased, line, len, &ids, err)) {
            rc = sl_err_wrap(err, "%s line %zu", name, lineno);
            break;
        }
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", ids.v[i]);
        if (putchar('\n') == EOF) {
            rc = sl_err_set(err, SL_EIO, "writing standard output failed");
            break;
        }
    }
    if (!rc && ferror(f))
        rc = sl_err_set(err, SL_EIO, "%s: read error", name);
    free(line);
    dev_ids_free(&ids);
    return rc;
}

static int data_tokenize(int argc, char **argv)
{
    const char *vpath = NULL;
    int cased = 0;
    paths files = {0};
    sl_err err = {0};
    const dopt opts[] = {{"--vocab", 's', &vpath, 0, 0},
                         {"--cased", 'f', &cased, 0, 0},
                         {NULL, 0, NULL, 0, 0}};
    int stop, rc = parse_opts("data tokenize", argc, argv, opts, &files, &stop);
    if (stop)
        goto done;
    rc = 2;
    if (!vpath) {
        sl_cli_fail("data tokenize", 2, "--vocab is required");
        goto done;
    }
    rc = 1;
    dev_vocab *v = dev_vocab_load(vpath, &err);
    if (!v) {
        sl_cli_fail("data tokenize", 1, "%s", err.msg);
        goto done;
    }
    check_case(v, cased);
    if (!files.n) {
        rc = tokenize_stream(v, cased, stdin, "standard input", &err) ? 1 : 0;
    } else {
        rc = 0;
        for (size_t i = 0; i < files.n && !rc; i++) {
            if (!strcmp(files.p[i], "-")) {
                rc = tokenize_stream(v, cased, stdin, "standard input", &err) ? 1 : 0;
                continue;
            }
            FILE *f = fopen(files.p[i], "r");
            if (!f) {
                sl_err_set(&err, SL_EIO, "cannot open %s: %s", files.p[i], strerror(errno));
                rc = 1;
                break;
            }
            rc = tokenize_stream(v, cased, f, files.p[i], &err) ? 1 : 0;
            fclose(f);
        }
    }
    if (fflush(stdout) != 0 && !rc) {
        sl_err_set(&err, SL_EIO, "writing standard output failed");
        rc = 1;
    }
    if (rc)
        sl_cli_fail("data tokenize", 1, "%s", err.msg);
    dev_vocab_free(v);
done:
    paths_free(&files);
    return rc;
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2) {
        usage_data(stderr, NULL);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        usage_data(stdout, NULL);
        return 0;
    }
    if (!strcmp(sub, "vocab"))
        return data_vocab(argc - 1, argv + 1);
    if (!strcmp(sub, "prepare"))
        return data_prepare(argc - 1, argv + 1);
    if (!strcmp(sub, "inspect"))
        return data_inspect(argc - 1, argv + 1);
    if (!strcmp(sub, "tokenize"))
        return data_tokenize(argc - 1, argv + 1);
    return sl_cli_fail("data", 2, "unknown subcommand '%s' (vocab, prepare, inspect, tokenize)",
                       sub);
}
