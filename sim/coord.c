/* SPDX-License-Identifier: MIT */
/*
 * The simulated allotd's life (coord.h): start, commit, kill, restart
 * from the store, stop. The store's audit clock is the engine's, so
 * that a run is the same whatever the wall clock says.
 */
#include "coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

/* Audit times: the engine's clock from a fixed origin. */
static int64_t
store_clock(void *ctx)
{
	const sim_coord *c = ctx;
	uint64_t ns = c->o.clock(c->o.clock_ctx);
	return 1700000000000 + (int64_t) (ns / 1000000u);
}

/* Open the store and create the state on it (or without one). */
static int
open_run(sim_coord *c)
{
	char err[512];
	c->o.store = NULL;
	if (c->with_store) {
		int rc = allot__store_open(
		    c->path, NULL, NULL, err, sizeof err, &c->store);
		if (rc != ALLOT_OK)
			return rc;
		allot__store_set_clock(c->store, store_clock, c);
		c->o.store = c->store;
	}
	allot_config *cc = allot__config_dup(c->cfg);
	if (cc == NULL)
		return ALLOT_ENOMEM;
	int rc = allot__state_create(&c->o, cc, "sim", c->text, &c->st);
	if (rc != ALLOT_OK)
		allot_config_free(cc);
	return rc;
}

int
sim_coord_start(sim_coord *c, const allot__state_opts *o,
    const allot_config *cfg, const char *text, bool with_store)
{
	memset(c, 0, sizeof *c);
	c->o = *o;
	c->cfg = cfg;
	c->text = text;
	c->with_store = with_store;
	if (with_store) {
		const char *tmp = getenv("TMPDIR");
		snprintf(c->dir, sizeof c->dir, "%s/allot-sim-XXXXXX",
		    tmp != NULL && strlen(tmp) < 40 ? tmp : "/tmp");
		if (mkdtemp(c->dir) == NULL) {
			c->dir[0] = '\0';
			return ALLOT_EIO;
		}
		snprintf(c->path, sizeof c->path, "%s/allot.db", c->dir);
	}
	return open_run(c);
}

void
sim_coord_commit(sim_coord *c)
{
	if (c->store != NULL)
		allot__store_flush(c->store);
}

void
sim_coord_kill(sim_coord *c)
{
	allot__state_destroy(c->st);
	c->st = NULL;
	/* Its queued rows die with it: the handle is only closed (which
	 * would commit them) at the end of the run, after the file has
	 * served the restart. */
	c->dead = c->store;
	c->store = NULL;
}

int
sim_coord_restart(sim_coord *c)
{
	int rc = open_run(c);
	if (rc == ALLOT_OK)
		rc = allot__state_restore(c->st);
	return rc;
}

void
sim_coord_stop(sim_coord *c)
{
	allot__state_destroy(c->st);
	c->st = NULL;
	allot__store_close(c->store);
	allot__store_close(c->dead);
	c->store = c->dead = NULL;
	if (c->dir[0] != '\0') {
		static const char *const files[] = { "allot.db",
			"allot.db-wal", "allot.db-shm", "allot.db-journal" };
		char p[128];
		for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
			snprintf(p, sizeof p, "%s/%s", c->dir, files[i]);
			unlink(p);
		}
		rmdir(c->dir);
		c->dir[0] = '\0';
	}
}
