/* SPDX-License-Identifier: MIT */
/*
 * The admissions ledger (admissions.h): exact sliding windows over a
 * buffer of recent admissions, taken a block at a time.
 */
#include "admissions.h"

#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

/* Windows are taken in blocks of this many first admissions. */
#define ADM_BLOCK 16

/* The first admission from j on after `lim`: SIM_ADM_PAD at a time without
 * a branch on each (admissions are sorted, so the count of those within
 * is how far to move; a sentinel is never within). */
static size_t
adm_after(const sim_adm *a, size_t j, uint64_t lim)
{
	for (;;) {
		size_t k = (size_t) (a[j].t <= lim) + (a[j + 1].t <= lim) +
		    (a[j + 2].t <= lim) + (a[j + 3].t <= lim) +
		    (a[j + 4].t <= lim) + (a[j + 5].t <= lim) +
		    (a[j + 6].t <= lim) + (a[j + 7].t <= lim);
		j += k;
		if (k < SIM_ADM_PAD)
			return j;
	}
}

/* Take the windows of length w (index k) from next[k] on, a block at a
 * time, while the block's windows are closed or, with `all` (the run is
 * over), to the end. A window's cost is what came before its end minus
 * what came before its first admission. */
static void
adm_take(sim_admvec *v, int k, uint64_t w, bool all)
{
	const sim_adm *a = v->a;
	size_t n = v->n, i0 = v->next[k], j = v->front[k];
	uint64_t best = v->best[k];
	while (i0 < n) {
		size_t i1 = i0 + ADM_BLOCK < n ? i0 + ADM_BLOCK : n;
		if (!all &&
		    (i1 - i0 < ADM_BLOCK || a[i1 - 1].t + w >= a[n - 1].t))
			break; /* its last window is still open */
		j = adm_after(a, j, a[i0].t + w);
		uint64_t c = a[j].before - a[i0].before;
		best = c > best ? c : best;
		size_t jb = adm_after(a, j, a[i1 - 1].t + w);
		if (a[jb].before - a[i0].before > best) {
			for (size_t i = i0 + 1, jj = j; i < i1; i++) {
				jj = adm_after(a, jj, a[i].t + w);
				c = a[jj].before - a[i].before;
				best = c > best ? c : best;
			}
		}
		j = jb;
		i0 = i1;
	}
	v->next[k] = i0;
	v->front[k] = j;
	v->best[k] = best;
}

/* Room for one more admission: take the closed windows, drop the
 * admissions no window left needs, or grow. */
static int
adm_room(sim_admvec *v, const uint64_t w[SIM_NWIN])
{
	if (v->n + SIM_ADM_PAD < v->cap)
		return ALLOT_OK;
	size_t lo = v->n;
	for (int k = 0; k < SIM_NWIN; k++) {
		adm_take(v, k, w[k], false);
		lo = v->next[k] < lo ? v->next[k] : lo;
	}
	if (v->cap > 0 && lo >= v->cap / 2) {
		memmove(
		    v->a, v->a + lo, (v->n + SIM_ADM_PAD - lo) * sizeof *v->a);
		v->n -= lo;
		for (int k = 0; k < SIM_NWIN; k++) {
			v->next[k] -= lo;
			v->front[k] -= lo;
		}
		return ALLOT_OK;
	}
	size_t cap = v->cap ? v->cap * 2 : 1024;
	sim_adm *na = realloc(v->a, cap * sizeof *na);
	if (na == NULL)
		return ALLOT_ENOMEM;
	if (v->a == NULL)
		for (size_t k = 0; k < SIM_ADM_PAD; k++)
			na[k] = (sim_adm) { UINT64_MAX, 0 };
	v->a = na;
	v->cap = cap;
	return ALLOT_OK;
}

/* `cost` tokens admitted at t, not before the previous admission; w: the
 * window lengths. */
int
sim_adm_push(sim_admvec *v, uint64_t t, uint32_t cost, uint64_t warm,
    const uint64_t w[SIM_NWIN])
{
	if (adm_room(v, w) != ALLOT_OK)
		return ALLOT_ENOMEM;
	sim_adm *a = v->a;
	a[v->n] = (sim_adm) { t, v->cost };
	v->cost += cost;
	v->n++;
	a[v->n].before = v->cost;
	a[v->n + SIM_ADM_PAD - 1] = (sim_adm) { UINT64_MAX, v->cost };
	v->total += cost;
	if (t >= warm)
		v->after_warmup += cost;
	return ALLOT_OK;
}

/* The run is over: the costliest window of each length. */
void
sim_adm_max_windows(
    sim_admvec *v, const uint64_t w[SIM_NWIN], double ret[SIM_NWIN])
{
	for (int k = 0; k < SIM_NWIN; k++) {
		if (v->a != NULL)
			adm_take(v, k, w[k], true);
		ret[k] = (double) v->best[k];
	}
}
