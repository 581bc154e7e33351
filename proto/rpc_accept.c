/* rpc_accept.c - keeps gRPC's listeners alive when descriptors run out.
 *
 * gRPC 1.51 stops a listener for good after one accept4() that fails with
 * EMFILE or ENFILE. This definition of accept4 interposes libc's for the
 * whole process (gRPC calls it through the PLT): it never lets those errors
 * reach gRPC. A connection that would leave fewer than a reserve of
 * descriptors (an eighth of the limit, 8..256) for the process's own files
 * is closed at once, and when the table is already full a spare descriptor
 * is given up for a moment to take the connection off the queue and close
 * it (the "reserve descriptor" trick of libuv and nginx). Either way gRPC
 * sees EAGAIN and waits for the next connection, so the listener serves
 * again as soon as descriptors are free. */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rpc_internal.h"
#include "sl_log.h"

static pthread_mutex_t spare_mu = PTHREAD_MUTEX_INITIALIZER;
static int spare = -1;
static atomic_long dropped;     /* connections closed for want of descriptors */
static atomic_llong last_log_s; /* when the last "limit reached" line was logged */

void rpc_accept_init(void)
{
    pthread_mutex_lock(&spare_mu);
    if (spare < 0)
        spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&spare_mu);
}

long rpc_accept_dropped(void) { return atomic_load(&dropped); }

/* The lowest descriptor number a new connection may get. */
static long conn_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > (1u << 30))
        return 1l << 30;
    long lim = (long)rl.rlim_cur, reserve = lim / 8;
    if (reserve < 8)
        reserve = 8;
    if (reserve > 256)
        reserve = 256;
    return lim - reserve;
}

static void note_drop(void)
{
    long n = atomic_fetch_add(&dropped, 1) + 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long last = atomic_load(&last_log_s);
    if ((last == 0 || ts.tv_sec - last >= 10) &&
        atomic_compare_exchange_strong(&last_log_s, &last, (long long)ts.tv_sec))
        sl_log_warn("rpc: descriptor limit reached, closing new connections",
                    "limit=%ld dropped_total=%ld", conn_fd_limit(), n);
}

/* With the table full: takes one connection off the queue of listener fd
 * and closes it. 1 done, 0 nothing to take (errno set), -1 no spare. */
static int drop_with_spare(int fd)
{
    pthread_mutex_lock(&spare_mu);
    if (spare < 0)
        spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (spare < 0) {
        pthread_mutex_unlock(&spare_mu);
        return -1;
    }
    close(spare);
    int c = (int)syscall(SYS_accept4, fd, NULL, NULL, SOCK_CLOEXEC);
    int e = errno;
    if (c >= 0)
        close(c);
    spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&spare_mu);
    errno = e;
    return c >= 0 ? 1 : 0;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
    socklen_t len0 = addrlen ? *addrlen : 0;
    for (;;) {
        if (addrlen)
            *addrlen = len0;
        int c = (int)syscall(SYS_accept4, fd, addr, addrlen, flags);
        if (c >= 0) {
            if (c < conn_fd_limit())
                return c;
            close(c);
            note_drop();
            continue;
        }
        if (errno != EMFILE && errno != ENFILE)
            return -1;
        int r = drop_with_spare(fd);
        if (r == 1) {
            note_drop();
            continue;
        }
        if (r < 0 || errno == EMFILE || errno == ENFILE)
            errno = EAGAIN;
        return -1;
    }
}
