/* sl_time.h - monotonic and wall-clock time. */
#ifndef SL_TIME_H
#define SL_TIME_H

#include <stdint.h>

/* Monotonic nanoseconds since an arbitrary origin. */
uint64_t sl_now_ns(void);
/* Monotonic seconds as a double. */
double sl_now_s(void);
/* Wall-clock UNIX time in seconds. */
int64_t sl_unix_time(void);
/* Wall-clock UNIX time in milliseconds. */
int64_t sl_unix_ms(void);

#endif
