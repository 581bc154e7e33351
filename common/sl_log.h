/* sl_log.h - levelled logging to stderr in a key=value style.
 *
 *   sl_log_info("step done", "step=%d loss=%.4f", step, loss);
 * prints
 *   2026-11-21T21:30:00.123Z info  step done step=12 loss=2.3412
 * The second argument is a printf format for the key=value fields (may be ""). */
#ifndef SL_LOG_H
#define SL_LOG_H

enum sl_log_level { SL_LOG_DEBUG = 0, SL_LOG_INFO, SL_LOG_WARN, SL_LOG_ERROR, SL_LOG_OFF };

void sl_log_set_level(int level);
/* Parses "debug", "info", "warn", "error", "off"; returns -1 if unknown. */
int sl_log_level_parse(const char *s);
void sl_log(int level, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define sl_log_debug(msg, ...) sl_log(SL_LOG_DEBUG, msg, __VA_ARGS__)
#define sl_log_info(msg, ...) sl_log(SL_LOG_INFO, msg, __VA_ARGS__)
#define sl_log_warn(msg, ...) sl_log(SL_LOG_WARN, msg, __VA_ARGS__)
#define sl_log_error(msg, ...) sl_log(SL_LOG_ERROR, msg, __VA_ARGS__)

#endif
