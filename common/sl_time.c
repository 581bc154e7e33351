#include "sl_time.h"

#include <time.h>

uint64_t sl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double sl_now_s(void) { return (double)sl_now_ns() * 1e-9; }

int64_t sl_unix_time(void) { return (int64_t)time(NULL); }

int64_t sl_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
