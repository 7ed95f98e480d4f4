/* SPDX-License-Identifier: MIT */
/*
 * allot-sim's library (also linked by tests/test_sim.c and the bench
 * suite `accuracy`): scenarios, the deterministic discrete-event engine
 * and the report. A scenario is a quota config, a replica schedule
 * (starts, graceful leaves, crashes), a sorted list of request arrivals
 * and optionally a coordinator outage. The engine feeds the same arrivals
 * to three limiters: the ideal single global token bucket per quota (and
 * one for the ceiling), allot (real agents, each driven by the real sync
 * engine agent/sync_core.c over a simulated transport, and the real
 * coordinator registry coordinator/state/state.c, all on one virtual clock)
 * and the equal static split; then it computes the figures defined in
 * docs/allocation.md. Everything is a function of the scenario and the
 * seed: two runs print the same numbers.
 */
#ifndef ALLOT_SIM_H
#define ALLOT_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <allot/allot.h>

#define SIM_NS 1000000000ull
#define SIM_MAX_REPLICAS 1024u
#define SIM_MAX_KEYS 64u
#define SIM_WARMUP_INTERVALS 3.0
#define SIM_CONVERGE_TOL 0.01
#define SIM_CONVERGE_MAX_INTERVALS 100.0

/* allot runs twice: as shipped, with the tail path (a request its local
 * bucket is short of waits for the central reserve), and local only
 * (every quota `reserve: 0`, no wait): docs/allocation.md. */
typedef enum sim_mode {
	SIM_IDEAL = 0,
	SIM_ALLOT = 1,
	SIM_SPLIT = 2,
	SIM_LOCAL = 3,
	SIM_NMODES = 4,
} sim_mode;

extern const char *const sim_mode_names[SIM_NMODES];

/* One request. `caller` indexes cfg->callers (== ncallers: an identity
 * without a quota, charged to the default quota); `endpoint` indexes
 * cfg->endpoints (== nendpoints: the default weight). */
typedef struct sim_arrival {
	uint64_t t; /* ns since the start */
	uint32_t replica;
	uint16_t caller;
	uint16_t endpoint;
} sim_arrival;

typedef enum sim_change_kind {
	SIM_START = 0, /* the replica starts (its agent registers) */
	SIM_LEAVE = 1, /* graceful stop: Leave, then gone */
	SIM_CRASH = 2, /* gone without a word */
} sim_change_kind;

typedef struct sim_change {
	uint64_t t;
	uint32_t replica;
	sim_change_kind kind;
} sim_change;

/* Transport and timing. */
typedef struct sim_params {
	uint32_t interval_ms; /* T of the agents and the coordinator */
	uint64_t seed;
	double latency_ms; /* one way */
	double latency_jitter_ms; /* uniform extra, one way */
	double loss; /* probability a message is lost */
	double sync_jitter; /* agents' T jitter (allot default 0.1) */
	uint32_t lease_ms;
	uint32_t expiry_intervals;
	/* allotd's --loan-frac (docs/allocation.md, "Loans"); below 0:
	 * allotd's default. */
	double loan_frac;
	/* The tail path: an Ask's round trip (no jitter, no loss but the
	 * scenario's), the coordinator's time to serve it, and how long a
	 * request waits for the answer at most (the shipped default). */
	double central_rtt_ms;
	double central_serve_ms;
	double wait_ms;
	/* The agents let the reserve keep the parts of a token their
	 * buckets hold when it cannot complete them (AskKey.pool), as
	 * shipped (agent/tail.h); false measures without. */
	bool pool;
	/* Also run allot local only (SIM_LOCAL); false: its figures are
	 * zero. */
	bool run_local;
} sim_params;

void sim_params_init(sim_params *p);

typedef struct sim_scenario {
	char name[32];
	char *description; /* one line */
	char *config_text; /* the quota file (YAML) */
	allot_config *cfg;
	uint32_t nreplicas; /* replica ids 0 .. nreplicas - 1 */
	sim_change *changes; /* sorted by time */
	size_t nchanges;
	sim_arrival *arr; /* sorted by time */
	size_t narr;
	uint64_t duration; /* ns */
	uint64_t outage_from; /* coordinator unreachable in [from, to) */
	uint64_t outage_to;
	bool demand_below_r; /* every quota's demand is below its R */
	int noisy_caller; /* the noisy neighbour, or -1 */
	bool graceful; /* replica-count changes are graceful */
	/* The coordinator is killed at outage_from (its state destroyed,
	 * what its store had not committed lost) and restarted at
	 * outage_to from its SQLite store (allot__state_restore), as
	 * allotd after a SIGKILL; agents see it unreachable between. */
	bool restart;
} sim_scenario;

/* The names of the built-in scenarios, NULL-terminated ("all"). */
extern const char *const sim_scenario_names[];

/* The seeded families of issue 13 (sim/families.c), NULL-terminated
 * ("families"): every seed draws its own parameters from ranges, and
 * every caller stays below its quota on average. sim_scenario_builtin
 * builds them too. */
extern const char *const sim_family_names[];

/* Build a built-in scenario. `duration_s` <= 0 takes its default.
 * `without_noisy`: drop the noisy caller's arrivals (the reference run
 * of the noisy-neighbour figure). Returns ALLOT_OK or ALLOT_ENOENT for an
 * unknown name; `err` says why on failure. */
int sim_scenario_builtin(const char *name, const sim_params *p,
    double duration_s, bool without_noisy, sim_scenario *ret, char *err,
    size_t errlen);

/* A scenario from an arrival trace (CSV `time_s,replica,caller,endpoint`,
 * docs/allocation.md) and a quota file. `schedule` (may be NULL) is a
 * list of changes "TIME:+N", "TIME:-N" (N leave), "TIME:xN" (N crash),
 * comma separated, applied to the replicas in order; without it every
 * replica named in the trace runs for the whole trace. */
int sim_scenario_trace(const char *csv_path, const char *config_path,
    const char *schedule, double duration_s, sim_scenario *ret, char *err,
    size_t errlen);

void sim_scenario_free(sim_scenario *s);

/* Figures of one key (or of the ceiling) in one mode. */
typedef struct sim_fig {
	double admitted; /* tokens */
	double over; /* units of R * T (docs/allocation.md) */
	double over_w[3]; /* per window T, 1 s, 10 s */
	double under; /* fraction, floored at 0 */
	double util; /* admitted / (R * duration + B) */
} sim_fig;

typedef struct sim_key {
	char identity[80];
	double rate; /* R (the ceiling C for the ceiling row) */
	double burst;
	char priority[32];
	bool ceiling; /* the aggregate row under the ceiling */
	double offered; /* tokens */
	double bootstrap; /* allot: admitted before a first Welcome,
	                     units of R * T */
	sim_fig f[SIM_NMODES];
} sim_key;

typedef struct sim_result {
	char scenario[32];
	uint32_t interval_ms;
	uint64_t seed;
	double duration_s;
	uint32_t nreplicas_max;
	size_t nkeys;
	sim_key keys[SIM_MAX_KEYS];
	/* Per mode: over = max over rows; under = max over quotas with
	 * ideal admissions; util = under a ceiling its row, else the sum
	 * over quotas; converge = allot only, the slowest change, in
	 * intervals (NaN: no change, or not applicable). */
	double over[SIM_NMODES];
	double under[SIM_NMODES];
	double util[SIM_NMODES];
	double converge[SIM_NMODES];
	double bootstrap; /* max over keys, units of R * T */
	/* allot's coordinator load */
	double syncs_per_s;
	double reports_per_s;
	double bytes_per_s;
	/* allot's invariants, checked throughout the run */
	double max_granted_ratio; /* max over time of granted / R */
	double max_held_over_bound; /* max of (held - live bound) / R: <= 0 */
	double max_bound_ratio; /* max of the live bound ratio */
	/* max of (the tokens in the agents' buckets and the central
	 * reserve - B) / B: <= 0, tokens are never made */
	double max_tokens_over_burst;
	uint64_t invariant_checks;
	/* Denial reports allotd refuted (denials() in
	 * coordinator/state/sync.c): honest agents never get one, so 0. */
	uint64_t denials_refuted;
	/* Noisy neighbour: the other callers' admitted cost against the
	 * run without the noisy caller (max relative difference), NaN if
	 * not computed. */
	double neighbour[SIM_NMODES];
	/* The tail path (allot as shipped): the fraction of decisions that
	 * waited for the central reserve, and the 99th percentile of what
	 * they waited, ms (0 when none did). */
	double central_fraction;
	double central_p99_ms;
	/* Asks answered; waits admitted and denied, of the denied those
	 * whose wait ran out and those the reserve could not cover. */
	uint64_t central_asks, central_allowed, central_denied;
	uint64_t central_late, central_short, central_dry;
	/* Admitted on the standby while no coordinator could be asked. */
	uint64_t central_standby;
	double wall_s; /* real time the run took: sim_run's modes
	                  (allot-sim also counts building the arrivals
	                  and the noisy neighbour's reference run) */
} sim_result;

/* Run the three modes on `s`. Returns ALLOT_OK or an error code. */
int sim_run(const sim_scenario *s, const sim_params *p, sim_result *ret);

/* Fill ret->neighbour from a run without the noisy caller. */
void sim_neighbour(
    sim_result *with, const sim_result *without, int noisy_caller);

/* Output. */
/* User and system time of the process, every thread, in seconds (NaN
 * when unavailable): the simulator's speed per CPU second. */
double sim_cpu_s(void);

void sim_print_table(FILE *f, const sim_result *r, bool per_key);
void sim_print_json(FILE *f, const sim_result *r);
void sim_print_summary_header(FILE *f);
void sim_print_summary_row(FILE *f, const sim_result *r);

#endif
