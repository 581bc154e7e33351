/* tb_delay.c - a one-way delay between sites, in userspace, for kernels
 * without netem.
 *
 * The testbed's router namespace sends every forwarded IPv4 packet into a
 * TUN device (policy routing: packets that did not come from the TUN device
 * are routed to it); this program reads each one, holds it for the delay of
 * its (source site, destination site) pair and writes it back, and the
 * kernel then routes it to its destination site. A site is the third octet
 * of an address in NET/16: 10.90.3.2 is site 3 of 10.90.0.0/16. Packets of
 * one pair keep their order (one delay per pair, one FIFO per pair).
 * Bandwidth is not this program's business: the sites shape their uplinks
 * with htb.
 *
 *   tb-delay --tun NAME --net A.B.0.0 [--delay X:Y:MS]... [--ready FILE]
 *
 * --delay X:Y:MS holds packets from site X to site Y (and from Y to X) for
 * MS milliseconds (fractions allowed); other pairs pass at once. --ready
 * FILE is written once the TUN device exists. Runs until SIGINT or SIGTERM,
 * at real-time priority where it may (it is the network: it must not wait
 * behind the devices' computations). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define NSITE 256
#define PKT_MAX 65536
#define QUEUED_MAX (512u << 20) /* bytes held at most; beyond, packets are dropped */

typedef struct pkt {
    struct pkt *next;
    int64_t due_ns;
    size_t len;
    uint8_t data[];
} pkt;

typedef struct fifo {
    pkt *head, *tail;
} fifo;

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void usage(void)
{
    fprintf(stderr, "usage: tb-delay --tun NAME --net A.B.0.0 [--delay X:Y:MS]... [--ready FILE]\n");
}

static int tun_open(const char *name)
{
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "tb-delay: /dev/net/tun: %s\n", strerror(errno));
        return -1;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "tb-delay: TUNSETIFF %s: %s\n", name, strerror(errno));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        fprintf(stderr, "tb-delay: O_NONBLOCK: %s\n", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int parse_delay(const char *s, int64_t *delay_ns)
{
    unsigned x, y;
    double ms;
    char tail;
    if (sscanf(s, "%u:%u:%lf%c", &x, &y, &ms, &tail) != 3 || x >= NSITE || y >= NSITE || !(ms >= 0) ||
        ms > 10000) {
        fprintf(stderr, "tb-delay: --delay %s: expected X:Y:MS with sites 0..255 and 0..10000 ms\n", s);
        return -1;
    }
    int64_t d = (int64_t)(ms * 1e6 + 0.5);
    delay_ns[x * NSITE + y] = d;
    delay_ns[y * NSITE + x] = d;
    return 0;
}

/* Writes one packet back into the kernel; a full queue there drops it (as a
 * router would). */
static void emit(int fd, const uint8_t *p, size_t len, unsigned long *dropped)
{
    if (write(fd, p, len) != (ssize_t)len)
        (*dropped)++;
}

int main(int argc, char **argv)
{
    const char *tun = NULL, *net = NULL, *ready = NULL;
    static int64_t delay_ns[NSITE * NSITE];
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            usage();
            return 2;
        }
        if (!strcmp(argv[i], "--tun"))
            tun = argv[++i];
        else if (!strcmp(argv[i], "--net"))
            net = argv[++i];
        else if (!strcmp(argv[i], "--ready"))
            ready = argv[++i];
        else if (!strcmp(argv[i], "--delay")) {
            if (parse_delay(argv[++i], delay_ns))
                return 2;
        } else {
            usage();
            return 2;
        }
    }
    struct in_addr na;
    if (!tun || !net || strlen(tun) >= IFNAMSIZ || inet_pton(AF_INET, net, &na) != 1) {
        usage();
        return 2;
    }
    uint32_t prefix = ntohl(na.s_addr) & 0xffff0000u;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct sched_param sp = {.sched_priority = 10};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
        fprintf(stderr, "tb-delay: no real-time priority (%s): delays may wait behind other work\n",
                strerror(errno));

    int fd = tun_open(tun);
    if (fd < 0)
        return 1;
    if (ready) {
        FILE *f = fopen(ready, "w");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f)) {
            fprintf(stderr, "tb-delay: %s: %s\n", ready, strerror(errno));
            return 1;
        }
    }

    fifo *q = calloc((size_t)NSITE * NSITE, sizeof *q);
    int *active = malloc((size_t)NSITE * NSITE * sizeof *active); /* pairs with a queue */
    uint8_t *buf = malloc(PKT_MAX);
    if (!q || !active || !buf) {
        fprintf(stderr, "tb-delay: out of memory\n");
        return 1;
    }
    int nactive = 0;
    size_t queued = 0;
    unsigned long passed = 0, delayed = 0, dropped = 0, foreign = 0;
    while (!stop_flag) {
        /* release what is due, and find the next due time */
        int64_t now = now_ns(), next = -1;
        for (int k = 0; k < nactive;) {
            fifo *f = &q[active[k]];
            while (f->head && f->head->due_ns <= now) {
                pkt *p = f->head;
                f->head = p->next;
                if (!f->head)
                    f->tail = NULL;
                emit(fd, p->data, p->len, &dropped);
                queued -= p->len;
                free(p);
            }
            if (!f->head) {
                active[k] = active[--nactive];
                continue;
            }
            if (next < 0 || f->head->due_ns < next)
                next = f->head->due_ns;
            k++;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        struct timespec ts, *tsp = NULL;
        if (next >= 0) {
            int64_t d = next - now_ns();
            if (d < 0)
                d = 0;
            ts.tv_sec = d / 1000000000;
            ts.tv_nsec = d % 1000000000;
            tsp = &ts;
        }
        int r = ppoll(&pfd, 1, tsp, NULL);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "tb-delay: poll: %s\n", strerror(errno));
            return 1;
        }
        if (r <= 0)
            continue;
        for (int n = 0; n < 256; n++) { /* drain what is there, then release again */
            ssize_t len = read(fd, buf, PKT_MAX);
            if (len < 0 && (errno == EAGAIN || errno == EINTR))
                break;
            if (len < 0) {
                fprintf(stderr, "tb-delay: read: %s\n", strerror(errno));
                return 1;
            }
            if (len < 20 || (buf[0] >> 4) != 4) {
                foreign++; /* not IPv4: passes as it came */
                emit(fd, buf, (size_t)len, &dropped);
                continue;
            }
            uint32_t src, dst;
            memcpy(&src, buf + 12, 4);
            memcpy(&dst, buf + 16, 4);
            src = ntohl(src);
            dst = ntohl(dst);
            int64_t d = 0;
            int pair = -1;
            if ((src & 0xffff0000u) == prefix && (dst & 0xffff0000u) == prefix) {
                pair = (int)(((src >> 8) & 0xff) * NSITE + ((dst >> 8) & 0xff));
                d = delay_ns[pair];
            }
            if (d == 0) {
                passed++;
                emit(fd, buf, (size_t)len, &dropped);
                continue;
            }
            if (queued + (size_t)len > QUEUED_MAX) {
                dropped++;
                continue;
            }
            pkt *p = malloc(sizeof *p + (size_t)len);
            if (!p) {
                dropped++;
                continue;
            }
            p->next = NULL;
            p->due_ns = now_ns() + d;
            p->len = (size_t)len;
            memcpy(p->data, buf, (size_t)len);
            fifo *f = &q[pair];
            if (!f->head)
                active[nactive++] = pair;
            if (f->tail)
                f->tail->next = p;
            else
                f->head = p;
            f->tail = p;
            queued += (size_t)len;
            delayed++;
        }
    }
    fprintf(stderr, "tb-delay: %lu packets delayed, %lu passed, %lu not IPv4, %lu dropped\n", delayed,
            passed, foreign, dropped);
    for (int k = 0; k < nactive; k++)
        for (pkt *p = q[active[k]].head, *nx; p; p = nx) {
            nx = p->next;
            free(p);
        }
    free(q);
    free(active);
    free(buf);
    close(fd);
    return 0;
}
