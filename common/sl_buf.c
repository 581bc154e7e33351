/* sl_buf.c - a growing string (sl_buf.h). */
#include "sl_buf.h"

#include <stdarg.h>
#include <stdio.h>

#include "sl_mem.h"

void sl_buf_printf(sl_buf *b, const char *fmt, ...)
{
    if (!b->s) {
        b->cap = 4096;
        b->s = sl_xmalloc(b->cap);
        b->n = 0;
        b->s[0] = 0;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        if (k < 0)
            return;
        b->cap = 2 * b->cap + (size_t)k + 64;
        b->s = sl_xrealloc(b->s, b->cap);
    }
}

void sl_buf_xml(sl_buf *b, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '<')
            sl_buf_printf(b, "&lt;");
        else if (c == '>')
            sl_buf_printf(b, "&gt;");
        else if (c == '&')
            sl_buf_printf(b, "&amp;");
        else if (c == '"')
            sl_buf_printf(b, "&quot;");
        else if (c == '\'')
            sl_buf_printf(b, "&#39;");
        else if (c < 0x20 && c != '\n' && c != '\t')
            sl_buf_printf(b, "?");
        else
            sl_buf_printf(b, "%c", c);
    }
}
