/* dev_labels.h - a label vocabulary (labels.txt): the class names of a
 * sequence-classification dataset, one per line, line number = class id.
 *
 * Strict like vocab.txt: every name is 1..DEV_LABEL_MAX_BYTES bytes of UTF-8
 * without control characters (tab and CR included) and without a leading
 * or trailing space; no name twice; 2..DEV_LABELS_MAX names. CRLF line ends
 * and a missing final newline are accepted. Errors name the file and line.
 * The hash is BLAKE2b-256 over the names, each followed by '\n' (the image
 * dev_labels_text gives and a labelled shard stores). The limits are the
 * model's (BAL_MAX_LABELS, BAL_MAX_LABEL_BYTES in balancer/bal.h). */
#ifndef DEV_LABELS_H
#define DEV_LABELS_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

#define DEV_LABELS_MAX 65536
#define DEV_LABEL_MAX_BYTES 256

typedef struct dev_labels dev_labels;

dev_labels *dev_labels_load(const char *path, sl_err *err);
/* The same from a buffer holding a labels.txt image; `name` in messages. */
dev_labels *dev_labels_parse(const char *buf, size_t len, const char *name, sl_err *err);
/* From n names (checked as the file's lines are). With sort, in numeric
 * order when every name is a decimal number ("2" before "10"), else in
 * byte order; otherwise in the order given. */
dev_labels *dev_labels_from(const char *const *names, int n, int sort, const char *name,
                            sl_err *err);
void dev_labels_free(dev_labels *l);
int dev_labels_count(const dev_labels *l);
const char *dev_labels_name(const dev_labels *l, int id); /* NULL if out of range */
/* All the names in id order (count of them): for config.json's id2label. */
const char *const *dev_labels_names(const dev_labels *l);
int dev_labels_find(const dev_labels *l, const char *s, size_t n); /* -1 if absent */
/* The labels.txt image ("name\n" per label) that the hash covers. */
const char *dev_labels_text(const dev_labels *l, size_t *len);
void dev_labels_hash(const dev_labels *l, uint8_t out[32]);
/* Whether s (n bytes) may be a label; *why says why not. */
int dev_label_ok(const char *s, size_t n, const char **why);

#endif
