/* coord_http.c - the coordinator's HTTP server (libmicrohttpd, a pool of two
 * threads of its own): /metrics, the dashboard (/ and /job/ID). Every page
 * is built from a snapshot of the job manager (its lock held only to copy)
 * and the device registry read through a database connection of its own, so
 * a slow or stalled HTTP client never holds up an RPC handler.
 *
 * Loopback by default; another address only with a bearer token, which
 * every request must then carry (compared in constant time). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord_internal.h"
#include "coord_obs.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

#define MAX_CSV (16u << 20) /* of metrics.csv the job page reads: its tail */

struct coord_http {
    coord *c;
    struct MHD_Daemon *d;
    uint8_t auth[32]; /* BLAKE2b of "Bearer TOKEN" */
    int has_auth;
    char host[256];   /* the listen address's host ("[v6]" bracketed) */
    char name[256];   /* another name for it, or "" */
    int loopback;
    pthread_mutex_t db_mu;
    coord_state *db;
    int port;
};

int coord_http_read_token(const char *path, char **token, sl_err *err)
{
    char *buf = NULL;
    size_t n = 0;
    if (sl_read_file(path, 4096, &buf, &n, err))
        return sl_err_wrap(err, "--http-token");
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    buf[n] = 0;
    int ok = n >= 16 && n <= 1024;
    for (size_t i = 0; ok && i < n; i++)
        ok = buf[i] > 0x20 && buf[i] < 0x7f;
    if (!ok) {
        free(buf);
        return sl_err_set(err, SL_EINVAL, "--http-token %s: the token must be one line of 16 to "
                          "1024 printable characters without spaces", path);
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && (sb.st_mode & 077))
        sl_log_warn("coordinator: the HTTP token file is readable by group or others", "path=%s "
                    "mode=%04o", path, (unsigned)(sb.st_mode & 07777));
    *token = buf;
    return 0;
}

/* ---- responses ---------------------------------------------------------------- */

static enum MHD_Result send_buf(struct MHD_Connection *conn, unsigned status, const char *type,
                                char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                            "frame-ancestors 'none'");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"skyloom\"");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    char *body = sl_xmalloc(n + 2);
    memcpy(body, line, n);
    body[n] = '\n';
    return send_buf(conn, status, "text/plain; charset=utf-8", body, n + 1);
}

/* ---- pages --------------------------------------------------------------------- */

/* The tail of a job's metrics.csv (whole lines), or NULL. */
static char *read_csv(const coord *c, const char *job)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/jobs/%s/metrics.csv", c->o.state, job);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (fd < 0)
        return NULL;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return NULL;
    }
    size_t size = (size_t)sb.st_size, want = size > MAX_CSV ? MAX_CSV : size;
    char *buf = sl_try_malloc(want + 1);
    ssize_t got = buf ? pread(fd, buf, want, (off_t)(size - want)) : -1;
    close(fd);
    if (got < 0) {
        free(buf);
        return NULL;
    }
    buf[got] = 0;
    if (want < size) { /* started mid-line */
        char *nl = strchr(buf, '\n');
        if (nl)
            memmove(buf, nl + 1, strlen(nl + 1) + 1);
    }
    return buf;
}

static int job_id_ok(const char *s)
{
    if (strlen(s) != 17 || s[0] != 'j')
        return 0;
    for (int i = 1; i < 17; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

static enum MHD_Result route(coord_http *h, struct MHD_Connection *conn, const char *url)
{
    coord *c = h->c;
    coord_snapshot s;
    sl_buf b = {0};
    sl_err err = {0};
    int rc = 0;
    if (!strcmp(url, "/metrics") || !strcmp(url, "/")) {
        coord_jobs_snapshot(c->jobs, NULL, &s);
        pthread_mutex_lock(&h->db_mu);
        rc = url[1] ? coord_metrics_text(c, h->db, &s, &b, &err)
                    : coord_dash_index(c, h->db, &s, &b, &err);
        pthread_mutex_unlock(&h->db_mu);
        coord_snapshot_free(&s);
        if (rc) {
            free(b.s);
            sl_log_error("coordinator: HTTP page failed", "url=%s reason=\"%s\"", url, err.msg);
            return send_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "%s", err.msg);
        }
        return send_buf(conn, MHD_HTTP_OK,
                        url[1] ? "text/plain; version=0.0.4; charset=utf-8" : "text/html; charset=utf-8",
                        b.s, b.n);
    }
    if (!strncmp(url, "/job/", 5)) {
        const char *id = url + 5;
        if (!job_id_ok(id) || coord_jobs_snapshot(c->jobs, id, &s)) {
            if (job_id_ok(id))
                coord_snapshot_free(&s);
            return send_text(conn, MHD_HTTP_NOT_FOUND, "no job '%.40s'", id);
        }
        char *csv = read_csv(c, id);
        coord_dash_job(&s, csv, &b);
        free(csv);
        coord_snapshot_free(&s);
        return send_buf(conn, MHD_HTTP_OK, "text/html; charset=utf-8", b.s, b.n);
    }
    return send_text(conn, MHD_HTTP_NOT_FOUND, "not found: %.200s (try /, /metrics or /job/ID)", url);
}

/* Whether a request's Host names this server: the listen address or the
 * configured name (on loopback also localhost, 127.0.0.1 and [::1]), the
 * served port if a port is given. A server that requires a token takes any:
 * a page that made its name point here does not have the token. */
static int host_ok(const coord_http *h, const char *host)
{
    if (!host || h->has_auth)
        return 1; /* HTTP/1.0 sends none (a browser always does); a token needs no more */
    size_t n = strlen(host);
    const char *colon = host[0] == '[' ? strstr(host, "]:") : strrchr(host, ':');
    if (colon && host[0] == '[')
        colon++;
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port != h->port)
            return 0;
        n = (size_t)(colon - host);
    }
    static const char *const local[] = {"localhost", "127.0.0.1", "[::1]"};
    if ((strlen(h->host) == n && !strncasecmp(host, h->host, n)) ||
        (h->name[0] && strlen(h->name) == n && !strncasecmp(host, h->name, n)))
        return 1;
    for (size_t i = 0; h->loopback && i < sizeof local / sizeof *local; i++)
        if (strlen(local[i]) == n && !strncasecmp(host, local[i], n))
            return 1;
    return 0;
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload_data,
                             size_t *upload_data_size, void **req_cls)
{
    coord_http *h = cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    if (!host_ok(h, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)))
        return send_text(conn, MHD_HTTP_FORBIDDEN, "this coordinator is not served under that "
                         "Host name");
    if (h->has_auth) {
        /* compared as digests: the time taken says nothing of the token's
         * length or of how much of it matched */
        const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_AUTHORIZATION);
        uint8_t got[32];
        crypto_generichash(got, sizeof got, (const uint8_t *)(a ? a : ""), a ? strlen(a) : 0, NULL, 0);
        if (!a || sodium_memcmp(got, h->auth, sizeof got) != 0)
            return send_text(conn, MHD_HTTP_UNAUTHORIZED,
                             "a bearer token is required (Authorization: Bearer TOKEN)");
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return send_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD are served");
    return route(h, conn, url);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    /* mostly per request (a malformed one): debug, so that a flood does not flood the log */
    sl_log_debug("coordinator: HTTP", "reason=\"%s\"", msg);
}

/* ---- start and stop ---------------------------------------------------------------- */

static int loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* HOST:PORT or [V6]:PORT into an address. */
static int resolve(const char *listen, struct sockaddr_storage *ss, sl_err *err)
{
    char host[256];
    const char *port;
    if (listen[0] == '[') {
        const char *e = strchr(listen, ']');
        if (!e || e[1] != ':' || (size_t)(e - listen - 1) >= sizeof host)
            return sl_err_set(err, SL_EINVAL, "--http-listen '%s': expected HOST:PORT or [V6]:PORT",
                              listen);
        snprintf(host, sizeof host, "%.*s", (int)(e - listen - 1), listen + 1);
        port = e + 2;
    } else {
        const char *colon = strrchr(listen, ':');
        if (!colon || (size_t)(colon - listen) >= sizeof host || colon == listen)
            return sl_err_set(err, SL_EINVAL, "--http-listen '%s': expected HOST:PORT", listen);
        snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
        port = colon + 1;
    }
    char *end;
    long pn = strtol(port, &end, 10);
    if (!*port || *end || pn < 0 || pn > 65535)
        return sl_err_set(err, SL_EINVAL, "--http-listen '%s': the port must be 0..65535", listen);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g || !ai) {
        if (ai)
            freeaddrinfo(ai);
        return sl_err_set(err, SL_EINVAL, "--http-listen '%s': %s", listen, gai_strerror(g));
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return 0;
}

coord_http *coord_http_start(coord *c, const coord_http_opts *o, sl_err *err)
{
    struct sockaddr_storage ss;
    if (resolve(o->listen, &ss, err))
        return NULL;
    if (!loopback((struct sockaddr *)&ss) && !o->token) {
        sl_err_set(err, SL_EINVAL, "--http-listen %s is not a loopback address: the dashboard and "
                   "metrics are served there only with --http-token FILE (every request must then "
                   "carry it)", o->listen);
        return NULL;
    }
    if (sodium_init() < 0) {
        sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
        return NULL;
    }
    coord_http *h = sl_xcalloc(1, sizeof *h);
    h->c = c;
    pthread_mutex_init(&h->db_mu, NULL);
    if (o->token) {
        size_t n = strlen(o->token) + 8;
        char *auth = sl_xmalloc(n);
        snprintf(auth, n, "Bearer %s", o->token);
        crypto_generichash(h->auth, sizeof h->auth, (const uint8_t *)auth, strlen(auth), NULL, 0);
        sodium_memzero(auth, n);
        free(auth);
        h->has_auth = 1;
    }
    const char *colon = o->listen[0] == '[' ? strchr(o->listen, ']') : strrchr(o->listen, ':');
    snprintf(h->host, sizeof h->host, "%.*s", (int)(colon ? colon - o->listen + (o->listen[0] == '[')
                                                          : (long)strlen(o->listen)), o->listen);
    snprintf(h->name, sizeof h->name, "%s", o->name ? o->name : "");
    h->loopback = loopback((struct sockaddr *)&ss);
    if (!(h->db = coord_state_attach(c->state, err))) {
        coord_http_stop(h);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                     (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, serve, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)16,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)15,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64u << 10),
                            MHD_OPTION_END);
    if (!h->d) {
        int e = errno;
        sl_err_set(err, SL_EIO, "cannot serve HTTP on %s: %s", o->listen,
                   e ? strerror(e) : "libmicrohttpd refused to start");
        coord_http_stop(h);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    return h;
}

int coord_http_port(const coord_http *h) { return h->port; }

void coord_http_stop(coord_http *h)
{
    if (!h)
        return;
    if (h->d)
        MHD_stop_daemon(h->d);
    coord_state_close(h->db);
    pthread_mutex_destroy(&h->db_mu);
    sodium_memzero(h->auth, sizeof h->auth);
    free(h);
}
