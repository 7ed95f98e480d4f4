/* SPDX-License-Identifier: MIT */
/*
 * The simulated allotd's life (sim/coord.c): its registry state on the
 * engine's clock, without a store as in every scenario but `restart`,
 * or with a real SQLite store in a temporary directory, committed once
 * per interval as allotd does, so that it can be killed (the state
 * destroyed, what was not yet committed lost) and restarted from the
 * file with allot__state_restore(). Private to sim/.
 */
#ifndef ALLOT_SIM_COORD_H
#define ALLOT_SIM_COORD_H

#include <stdbool.h>

#include "state/state.h"
#include "store/store.h"

typedef struct sim_coord {
	allot__state *st; /* NULL while killed */
	allot__store *store; /* the live run's; NULL without a store */
	allot__store *dead; /* the killed run's, never flushed again */
	allot__state_opts o;
	const allot_config *cfg;
	const char *text;
	bool with_store;
	char dir[64]; /* the store's temporary directory */
	char path[96];
} sim_coord;

/* Create the state (a copy of `cfg`) as allotd starts, with a store in
 * a new temporary directory when `with_store`. ALLOT_OK or an error. */
int sim_coord_start(sim_coord *c, const allot__state_opts *o,
    const allot_config *cfg, const char *text, bool with_store);

/* allotd's group commit, once per interval (nothing without a store). */
void sim_coord_commit(sim_coord *c);

/* SIGKILL: the state is gone; rows queued since the last commit are
 * lost with it. */
void sim_coord_kill(sim_coord *c);

/* Start again from the store: a new state, allot__state_restore(). */
int sim_coord_restart(sim_coord *c);

/* The end of the run: destroy everything and remove the directory. */
void sim_coord_stop(sim_coord *c);

#endif
