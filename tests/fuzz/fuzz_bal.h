/* fuzz_bal.h - what the balancer's input fuzz targets share: the input as a
 * C string, and the promise every refusal keeps (one line that starts with
 * the file's name and holds no control byte). */
#ifndef FUZZ_BAL_H
#define FUZZ_BAL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"

#define REQUIRE(c)                                                                      \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s: property failed at line %d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* data[0..size) as a NUL-terminated string, cut at the first NUL (the
 * readers refuse a file holding one before parsing). */
static inline char *fz_text(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    REQUIRE(s != NULL);
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

static inline void fz_message_ok(const sl_err *err)
{
    REQUIRE(err->msg[0] != 0);
    for (const unsigned char *p = (const unsigned char *)err->msg; *p; p++)
        REQUIRE(*p >= 0x20 && *p != 0x7f);
}

#endif
