/* tb_probe.c - round-trip time and bandwidth between two hosts over TCP,
 * the testbed's check of its own links.
 *
 *   tb-probe serve --listen IP:PORT [--ready FILE]
 *   tb-probe measure --connect IP:PORT [--pings N] [--bytes B] [--json]
 *
 * serve answers one client at a time until SIGINT or SIGTERM. measure
 * sends N one-byte pings (each echoed; RTT = the median, min also shown),
 * then moves B bytes each way: a first transfer each way only warms the
 * connection (slow start), then three are timed from the request to the
 * last byte; bandwidth = B / (time - RTT), the median of the three. Both
 * ends run at real-time priority where they may: they measure the network,
 * and should not wait for a core behind other work. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (256u << 10)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_addr(const char *s, struct sockaddr_in *a)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return -1;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

/* all n bytes written (writing) or read; -1 on an error or end of stream */
static int full_io(int fd, uint8_t *b, size_t n, int writing)
{
    while (n) {
        ssize_t k = writing ? write(fd, b, n) : read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int full_write(int fd, const void *p, size_t n) { return full_io(fd, (uint8_t *)p, n, 1); }
static int full_read(int fd, void *p, size_t n) { return full_io(fd, p, n, 0); }

/* n bytes through a buffer of CHUNK: sent from it (writing) or received into it */
static int chunked_io(int fd, uint8_t *buf, uint64_t n, int writing)
{
    while (n) {
        size_t k = n < CHUNK ? (size_t)n : CHUNK;
        if (full_io(fd, buf, k, writing))
            return -1;
        n -= k;
    }
    return 0;
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* requests: a command byte and a 64-bit length */
static void put_req(uint8_t h[9], char cmd, uint64_t n)
{
    h[0] = (uint8_t)cmd;
    for (int i = 0; i < 8; i++)
        h[1 + i] = (uint8_t)(n >> (56 - 8 * i));
}

static uint64_t get_len(const uint8_t h[9])
{
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n = n << 8 | h[1 + i];
    return n;
}

static void serve_one(int c, uint8_t *buf)
{
    uint8_t h[9];
    while (full_read(c, h, 9) == 0) {
        uint64_t n = get_len(h);
        int rc = -1;
        if (h[0] == 'P' && n <= CHUNK)
            rc = full_read(c, buf, (size_t)n) || full_write(c, buf, (size_t)n);
        else if (h[0] == 'U')
            rc = chunked_io(c, buf, n, 0) || full_write(c, "k", 1);
        else if (h[0] == 'D')
            rc = chunked_io(c, buf, n, 1);
        if (rc)
            break;
    }
}

static int serve(const char *listen_at, const char *ready)
{
    struct sockaddr_in a;
    if (parse_addr(listen_at, &a)) {
        fprintf(stderr, "tb-probe: --listen %s: expected IPv4:PORT\n", listen_at);
        return 2;
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4)) {
        fprintf(stderr, "tb-probe: listen on %s: %s\n", listen_at, strerror(errno));
        return 1;
    }
    if (ready) {
        FILE *f = fopen(ready, "w");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f)) {
            fprintf(stderr, "tb-probe: %s: %s\n", ready, strerror(errno));
            return 1;
        }
    }
    uint8_t *buf = calloc(1, CHUNK);
    if (!buf)
        return 1;
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "tb-probe: accept: %s\n", strerror(errno));
            free(buf);
            return 1;
        }
        nodelay(c);
        serve_one(c, buf);
        close(c);
    }
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* seconds from a request to the end of a transfer of n bytes */
static int transfer(int fd, uint8_t *buf, char dir, uint64_t n, double *t)
{
    uint8_t h[9];
    put_req(h, dir, n);
    double t0 = now_s();
    if (full_write(fd, h, 9))
        return -1;
    if (dir == 'U') {
        uint8_t k;
        if (chunked_io(fd, buf, n, 1) || full_read(fd, &k, 1))
            return -1;
    } else if (chunked_io(fd, buf, n, 0)) {
        return -1;
    }
    *t = now_s() - t0;
    return 0;
}

static int measure(const char *to, int pings, uint64_t bytes, int json)
{
    struct sockaddr_in a;
    if (parse_addr(to, &a)) {
        fprintf(stderr, "tb-probe: --connect %s: expected IPv4:PORT\n", to);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        fprintf(stderr, "tb-probe: connect %s: %s\n", to, strerror(errno));
        return 1;
    }
    nodelay(fd);
    uint8_t *buf = calloc(1, CHUNK);
    double *r = calloc((size_t)pings + 1, sizeof *r), up[3], down[3];
    if (!buf || !r)
        return 1;
    int rc = 0;
    for (int i = 0; i <= pings && !rc; i++) { /* the first only warms up */
        uint8_t h[9];
        put_req(h, 'P', 1);
        double t0 = now_s();
        rc = full_write(fd, h, 9) || full_write(fd, "p", 1) || full_read(fd, buf, 1);
        r[i] = now_s() - t0;
    }
    double warm;
    rc = rc || transfer(fd, buf, 'U', bytes, &warm) || transfer(fd, buf, 'D', bytes, &warm);
    for (int i = 0; i < 3 && !rc; i++)
        rc = transfer(fd, buf, 'U', bytes, &up[i]) || transfer(fd, buf, 'D', bytes, &down[i]);
    close(fd);
    if (rc) {
        fprintf(stderr, "tb-probe: %s: the connection failed\n", to);
        free(buf);
        free(r);
        return 1;
    }
    qsort(r + 1, (size_t)pings, sizeof *r, cmp_d);
    qsort(up, 3, sizeof *up, cmp_d);
    qsort(down, 3, sizeof *down, cmp_d);
    double rtt = r[1 + pings / 2], rmin = r[1];
    double bu = (double)bytes * 8 / (up[1] - rtt), bd = (double)bytes * 8 / (down[1] - rtt);
    if (json)
        printf("{\"rtt_ms\": %.3f, \"rtt_min_ms\": %.3f, \"up_mbps\": %.2f, \"down_mbps\": %.2f}\n",
               rtt * 1e3, rmin * 1e3, bu / 1e6, bd / 1e6);
    else
        printf("rtt %.3f ms (min %.3f ms), up %.2f Mbit/s, down %.2f Mbit/s\n", rtt * 1e3,
               rmin * 1e3, bu / 1e6, bd / 1e6);
    free(buf);
    free(r);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    struct sched_param sp = {.sched_priority = 5};
    sched_setscheduler(0, SCHED_FIFO, &sp); /* best effort */
    if (argc < 2) {
        fprintf(stderr, "usage: tb-probe serve --listen IP:PORT [--ready FILE]\n"
                        "       tb-probe measure --connect IP:PORT [--pings N] [--bytes B] [--json]\n");
        return 2;
    }
    const char *listen_at = NULL, *to = NULL, *ready = NULL;
    long pings = 21;
    long long bytes = 4 << 20;
    int json = 0;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--json")) {
            json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tb-probe: %s needs a value\n", o);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(o, "--listen"))
            listen_at = v;
        else if (!strcmp(o, "--connect"))
            to = v;
        else if (!strcmp(o, "--ready"))
            ready = v;
        else if (!strcmp(o, "--pings"))
            pings = strtol(v, NULL, 10);
        else if (!strcmp(o, "--bytes"))
            bytes = strtoll(v, NULL, 10);
        else {
            fprintf(stderr, "tb-probe: unknown option %s\n", o);
            return 2;
        }
    }
    if (!strcmp(argv[1], "serve") && listen_at)
        return serve(listen_at, ready);
    if (!strcmp(argv[1], "measure") && to && pings >= 1 && pings <= 1000 && bytes >= 1024)
        return measure(to, (int)pings, (uint64_t)bytes, json);
    fprintf(stderr, "tb-probe: bad arguments (see the usage)\n");
    return 2;
}
