/* coord_state.h - the coordinator's durable state in SQLite (WAL mode). */
#ifndef COORD_STATE_H
#define COORD_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

typedef struct coord_state coord_state;

/* Opens (creating if needed) DIR/coordinator.db, WAL journal, schema migrated
 * to the current version. The directory is made private (0700; a wider mode
 * is narrowed and logged). DIR/coordinator.id marks a directory that holds
 * state (the same id is in the database): a database that is missing or
 * empty where the marker is, one whose id differs from it, a WAL file
 * without its database, a damaged first page or a failed quick_check is
 * refused with the reason. The -wal file is part of the state. */
coord_state *coord_state_open(const char *dir, sl_err *err);
/* Another connection to the database of an open state (one per thread). */
coord_state *coord_state_attach(const coord_state *first, sl_err *err);
/* Copies DIR's database, committed -wal contents included, to `out` (which
 * must not exist) with SQLite's online backup: safe while a coordinator
 * runs. The copy is integrity-checked; *devices gets its device count. */
int coord_state_backup(const char *dir, const char *out, int64_t *devices, sl_err *err);
void coord_state_close(coord_state *s);
/* The schema version stored in the database. */
int coord_state_schema_version(coord_state *s);
/* The journal mode SQLite reports ("wal"). */
const char *coord_state_journal_mode(coord_state *s);

/* ---- trust: tokens, devices, revocations (coord_registry.c) ---------------- */
/* Records a token hash (from the PKI spool) and the lifetime of the
 * certificates of the device it enrolls (0: the PKI's default); a known hash
 * is left alone. */
int coord_state_add_token(coord_state *s, const char *hash, const char *site, int64_t expires_at,
                          int64_t cert_seconds, sl_err *err);
int coord_state_add_revocation(coord_state *s, const char *device_id, int64_t at, sl_err *err);
/* 1 revoked, 0 not, -1 error. */
int coord_state_is_revoked(coord_state *s, const char *device_id, sl_err *err);

enum coord_token_check {
    COORD_TOKEN_OK,
    COORD_TOKEN_UNKNOWN,
    COORD_TOKEN_USED,
    COORD_TOKEN_EXPIRED,
    COORD_TOKEN_WRONG_SITE,
};
/* Looks a token hash up without using it; -1 on database errors. The
 * token's site goes to site_out (CERT_SITE_MAX + 1 bytes) and its
 * certificate lifetime to *cert_seconds when found. */
int coord_state_check_token(coord_state *s, const char *hash, const char *site, int64_t now,
                            char *site_out, int64_t *cert_seconds, sl_err *err);

typedef struct coord_device {
    const char *id, *site, *name, *cert_pem, *stage_address;
    int64_t enrolled_at, last_heartbeat;
    uint64_t heartbeat_seq;
    int revoked;
    const uint8_t *profile; /* serialized skyloom.v1.DeviceProfile */
    size_t profile_len;
    int64_t cert_seconds;   /* lifetime of its certificates; 0: the PKI's default */
} coord_device;

/* In one transaction: marks the token used (it must still be unused) and
 * inserts or replaces the device. */
int coord_state_enroll(coord_state *s, const char *token_hash, const coord_device *d, int64_t now,
                       sl_err *err);
/* Records a heartbeat; profile may be NULL (kept). 0 ok, 1 unknown device, -1 error. */
int coord_state_heartbeat(coord_state *s, const char *id, uint64_t seq, const uint8_t *profile,
                          size_t profile_len, const char *stage_address, int64_t now, sl_err *err);
/* 1 enrolled, 0 not, -1 error. */
int coord_state_device_known(coord_state *s, const char *id, sl_err *err);
/* An enrolled device's site (CERT_SITE_MAX + 1 bytes), current certificate
 * (*cert_pem malloc'd) and certificate lifetime. 0 ok, 1 unknown, -1 error. */
int coord_state_device_cert(coord_state *s, const char *id, char *site, char **cert_pem,
                            int64_t *cert_seconds, sl_err *err);
/* Records a device's renewed certificate. 0 ok, 1 unknown device, -1 error. */
int coord_state_set_cert(coord_state *s, const char *id, const char *cert_pem, sl_err *err);
/* Calls fn for each revoked device id; fn returns non-zero to stop. */
int coord_state_list_revoked(coord_state *s, int (*fn)(void *ud, const char *id), void *ud,
                             sl_err *err);
/* Calls fn for each device ordered by id; fn returns non-zero to stop. */
int coord_state_list_devices(coord_state *s, int (*fn)(void *ud, const coord_device *d), void *ud,
                             sl_err *err);

#endif
