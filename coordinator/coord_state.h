/* coord_state.h - the coordinator's durable state in SQLite (WAL mode). */
#ifndef COORD_STATE_H
#define COORD_STATE_H

#include "sl_err.h"

typedef struct coord_state coord_state;

/* Opens (creating if needed) DIR/coordinator.db, WAL journal, schema migrated
 * to the current version. */
coord_state *coord_state_open(const char *dir, sl_err *err);
void coord_state_close(coord_state *s);
/* The schema version stored in the database. */
int coord_state_schema_version(coord_state *s);
/* The journal mode SQLite reports ("wal"). */
const char *coord_state_journal_mode(coord_state *s);

#endif
