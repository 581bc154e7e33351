/* skyloom certs: the site PKI (init, token, revoke, show, rotate-coordinator). */
#include <stdio.h>
#include <string.h>

#include "cert.h"
#include "cli.h"

/* One usage text per certs command: `skyloom certs CMD --help` prints CMD's,
 * `skyloom certs --help` all of them. */
static const struct certs_cmd {
    const char *name, *synopsis, *text;
} certs_cmds[] = {
    {"init", "skyloom certs init   --pki DIR [--name N] [--san IP:A,DNS:B,...] [--cert-days D]",
     "init    makes the project CA (EC P-256), the coordinator's certificate (SANs:\n"
     "        localhost, 127.0.0.1 and --san) and an admin client certificate for\n"
     "        skyloom status. Private keys are written 0600; existing files are never\n"
     "        overwritten. --cert-days sets how long device certificates last\n"
     "        (default 365); devices renew theirs at two thirds of that.\n"},
    {"token", "skyloom certs token  --pki DIR --site S [--ttl 1h] [--cert-days D] [--json]",
     "token   prints a one-time enrollment token for a device of site S. The token\n"
     "        carries the CA's SHA-256 fingerprint; only its hash is kept, in DIR/spool,\n"
     "        until the coordinator (started with the same --pki) imports it.\n"
     "        --cert-days gives the device enrolled with it certificates of that\n"
     "        lifetime (instead of the PKI's default), renewals included.\n"},
    {"revoke", "skyloom certs revoke --pki DIR DEVICE_ID",
     "revoke  queues the revocation of a device id; the coordinator imports it on its\n"
     "        next call and refuses the device from then on (renewals too).\n"},
    {"show", "skyloom certs show   FILE [--json]", "show    prints the certificates in a PEM file.\n"},
    {"rotate-coordinator", "skyloom certs rotate-coordinator --pki DIR [--san IP:A,DNS:B,...] [--days 825]",
     "rotate-coordinator  a new key and certificate for the coordinator from the same\n"
     "        CA, same name and SANs (or --san: the defaults plus these), valid --days;\n"
     "        the old pair is kept as coordinator.{key,crt}.prev. Devices need\n"
     "        nothing; a running coordinator serves it to new connections within a\n"
     "        second, and a restarted one from the start.\n"},
};
#define N_CERTS_CMDS (int)(sizeof certs_cmds / sizeof certs_cmds[0])

static const char lifetime_text[] =
    "\n--cert-seconds N instead of --cert-days: lifetimes in seconds (at least 5), for\n"
    "tests and trials of renewal.\n";
static const char pki_env_text[] =
    "\nWithout --pki, the environment variable SKYLOOM_PKI gives the PKI directory; an\n"
    "option wins.\n";

static void usage(FILE *f, const struct certs_cmd *only)
{
    int k = 0;
    for (int i = 0; i < N_CERTS_CMDS; i++)
        if (!only || only == &certs_cmds[i])
            fprintf(f, "%s %s\n", k++ ? "      " : "usage:", certs_cmds[i].synopsis);
    fprintf(f, "\n");
    for (int i = 0; i < N_CERTS_CMDS; i++)
        if (!only || only == &certs_cmds[i])
            fputs(certs_cmds[i].text, f);
    if (!only || !strcmp(only->name, "init") || !strcmp(only->name, "token"))
        fputs(lifetime_text, f);
    if (!only || strcmp(only->name, "show"))
        fputs(pki_env_text, f);
}

/* Parses "--opt value" pairs; positional arguments go to pos. */
typedef struct opts {
    const char *pki, *name, *san, *site, *ttl, *pos, *cert_days, *cert_seconds, *days;
    int json, npos;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    const cli_opt table[] = {{"--pki", &o->pki},
                             {"--name", &o->name},
                             {"--san", &o->san},
                             {"--site", &o->site},
                             {"--ttl", &o->ttl},
                             {"--cert-days", &o->cert_days},
                             {"--cert-seconds", &o->cert_seconds},
                             {"--days", &o->days},
                             {NULL, NULL}};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_opt_take("certs", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (a[0] == '-' && a[1]) {
            return sl_cli_fail("certs", 2, "unknown option '%s'", a);
        } else {
            o->pos = a;
            o->npos++;
        }
    }
    return 0;
}

/* --cert-days / --cert-seconds: *s = the lifetime in seconds, 0 if neither. */
static int cert_lifetime(const opts *o, int64_t *s)
{
    sl_err err = {0};
    int64_t v;
    *s = 0;
    if (o->cert_days && o->cert_seconds)
        return sl_cli_fail("certs", 2, "--cert-days and --cert-seconds exclude each other");
    if (o->cert_days) {
        if (sl_parse_i64("--cert-days", o->cert_days, 1, 3650, &v, &err))
            return sl_cli_fail("certs", 2, "%s", err.msg);
        *s = v * 86400;
    } else if (o->cert_seconds) {
        if (sl_parse_i64("--cert-seconds", o->cert_seconds, CERT_MIN_SECONDS, CERT_MAX_SECONDS, &v,
                         &err))
            return sl_cli_fail("certs", 2, "%s", err.msg);
        *s = v;
    }
    return 0;
}

int cmd_certs(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout, NULL);
        return argc < 2 ? 2 : 0;
    }
    const struct certs_cmd *cc = NULL;
    for (int i = 0; i < N_CERTS_CMDS; i++)
        if (!strcmp(argv[1], certs_cmds[i].name))
            cc = &certs_cmds[i];
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, cc);
            return 0;
        }
    const char *sub = argv[1];
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    if (strcmp(sub, "show"))
        o.pki = cli_env_default(o.pki, CLI_ENV_PKI);
    sl_err err = {0};
    if (!strcmp(sub, "show")) {
        if (o.npos != 1)
            return sl_cli_fail("certs", 2, "show needs exactly one FILE");
        if (cert_show(o.pos, o.json, stdout, &err))
            return sl_cli_fail("certs", 1, "%s", err.msg);
        return 0;
    }
    if (!o.pki)
        return sl_cli_fail("certs", 2, "%s needs --pki DIR (or the environment variable %s)", sub,
                           CLI_ENV_PKI);
    int64_t life;
    if (cert_lifetime(&o, &life))
        return 2;
    if ((life && strcmp(sub, "init") && strcmp(sub, "token")) ||
        (o.days && strcmp(sub, "rotate-coordinator")))
        return sl_cli_fail("certs", 2, "%s takes no %s", sub,
                           o.days ? "--days" : o.cert_days ? "--cert-days" : "--cert-seconds");
    if (!strcmp(sub, "init")) {
        if (o.npos)
            return sl_cli_fail("certs", 2, "unexpected argument '%s'", o.pos);
        if (cert_pki_init(o.pki, o.name, o.san, &err) ||
            (life && cert_pki_set_device_seconds(o.pki, life, &err)))
            return sl_cli_fail("certs", 1, "%s", err.msg);
        char p[4200];
        snprintf(p, sizeof p, "%s/ca.crt", o.pki);
        printf("PKI created in %s\n", o.pki);
        return cert_show(p, 0, stdout, &err) ? sl_cli_fail("certs", 1, "%s", err.msg) : 0;
    }
    if (!strcmp(sub, "token")) {
        if (!o.site)
            return sl_cli_fail("certs", 2, "token needs --site S");
        int64_t ttl = 3600;
        if (o.ttl && sl_parse_duration("--ttl", o.ttl, &ttl, &err))
            return sl_cli_fail("certs", 2, "%s", err.msg);
        if (ttl < 1 || ttl > 30 * 86400)
            return sl_cli_fail("certs", 2, "--ttl must be between 1s and 30d");
        char tok[CERT_TOKEN_LEN];
        if (cert_token_create_ex(o.pki, o.site, ttl, life, tok, &err))
            return sl_cli_fail("certs", 1, "%s", err.msg);
        if (o.json)
            printf("{\"token\": \"%s\", \"site\": \"%s\", \"ttl_s\": %lld, \"cert_s\": %lld}\n",
                   tok, o.site, (long long)ttl, (long long)life);
        else
            printf("%s\n", tok);
        return 0;
    }
    if (!strcmp(sub, "revoke")) {
        if (o.npos != 1)
            return sl_cli_fail("certs", 2, "revoke needs exactly one DEVICE_ID");
        if (cert_revoke(o.pki, o.pos, &err))
            return sl_cli_fail("certs", err.code == SL_EINVAL ? 2 : 1, "%s", err.msg);
        printf("revocation of %s queued for the coordinator\n", o.pos);
        return 0;
    }
    if (!strcmp(sub, "rotate-coordinator")) {
        if (o.npos)
            return sl_cli_fail("certs", 2, "unexpected argument '%s'", o.pos);
        int64_t days = CERT_COORDINATOR_DAYS;
        if (o.days && sl_parse_i64("--days", o.days, 1, 3650, &days, &err))
            return sl_cli_fail("certs", 2, "%s", err.msg);
        if (cert_pki_rotate_coordinator(o.pki, o.san, (int)days, &err))
            return sl_cli_fail("certs", err.code == SL_EINVAL ? 2 : 1, "%s", err.msg);
        char p[4200];
        snprintf(p, sizeof p, "%s/coordinator.crt", o.pki);
        printf("new coordinator certificate in %s (the old pair kept as *.prev); a running "
               "coordinator serves it to new connections within a second\n", o.pki);
        return cert_show(p, 0, stdout, &err) ? sl_cli_fail("certs", 1, "%s", err.msg) : 0;
    }
    return sl_cli_fail("certs", 2,
                       "unknown subcommand '%s' (init, token, revoke, show, rotate-coordinator)", sub);
}
