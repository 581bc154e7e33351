/* sl_buf.h - a growing string for text built piece by piece (pages, SVG,
 * metrics). Starts empty ({0}); the caller frees s. */
#ifndef SL_BUF_H
#define SL_BUF_H

#include <stddef.h>

typedef struct sl_buf {
    char *s;
    size_t n, cap;
} sl_buf;

void sl_buf_printf(sl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s escaped for HTML and XML text and attributes; control bytes other than
 * newline and tab become '?'. */
void sl_buf_xml(sl_buf *b, const char *s);

#endif
