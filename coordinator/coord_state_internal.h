/* coord_state_internal.h - the database handle for coordinator/ files. */
#ifndef COORD_STATE_INTERNAL_H
#define COORD_STATE_INTERNAL_H

#include <sqlite3.h>

#include "coord_state.h"

sqlite3 *coord_state_db(coord_state *s);

#endif
