/* coord_upload.h - models uploaded a piece at a time for a job to start from
 * (job submit --init), kept until a submit claims them. */
#ifndef COORD_UPLOAD_H
#define COORD_UPLOAD_H

#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_err.h"

typedef struct coord_uploads coord_uploads;

/* Uploads live in `dir` (created); what a previous run left there goes on
 * (up to the slots; the rest is removed). */
coord_uploads *coord_uploads_open(const char *dir, sl_err *err);
void coord_uploads_close(coord_uploads *u);

/* One piece: appended if it starts where the file ends; the last checks the
 * size and BLAKE2b-256. An RPC code, with st set on refusal. */
int coord_uploads_piece(coord_uploads *u, const Skyloom__V1__UploadInitRequest *r, rpc_status *st);

/* Moves the finished upload `id` to `dest` and forgets it. */
int coord_uploads_claim(coord_uploads *u, const char *id, const char *dest, rpc_status *st);

#endif
