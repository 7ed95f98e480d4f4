/* SPDX-License-Identifier: MIT */
/*
 * The per-quota diff of two configs (config_diff.h): quotas matched by
 * their wire key, each described as one line of text, and the settings
 * of the whole file compared as pseudo-quotas. Both allotd (its audit
 * rows and its admin socket's answers) and allotctl go through here, so
 * what an operator reviews is what the audit table records. A quota's
 * text is written field by field from the field table
 * (config_fields.h), each as its type says.
 */
#include "config_diff.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "config_fields.h"
#include "hash.h"
#include "idmap.h"

const char *
allot__change_kind_name(allot__change_kind k)
{
	switch (k) {
	case ALLOT__QUOTA_ADDED: return "added";
	case ALLOT__QUOTA_REMOVED: return "removed";
	case ALLOT__QUOTA_CHANGED: return "changed";
	}
	return "?";
}

/* A number as written in a quota file: integers without a fraction,
 * others with six significant digits. */
static void
put_num(allot__buf *b, double v)
{
	if (v == floor(v) && fabs(v) < 1e15)
		allot__buf_printf(b, "%.0f", v);
	else
		allot__buf_printf(b, "%.6g", v);
}

/* A rate in the unit it was written in: "500/s", "1000/day". */
static void
put_rate(allot__buf *b, double per_s, uint32_t unit_s)
{
	static const struct {
		uint32_t s;
		const char *name;
	} units[] = { { 60, "min" }, { 3600, "h" }, { 86400, "day" } };
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (unit_s == units[i].s) {
			put_num(b, per_s * unit_s);
			allot__buf_printf(b, "/%s", units[i].name);
			return;
		}
	}
	put_num(b, per_s);
	allot__buf_puts(b, "/s");
}

static const char *
class_name(const allot_config *cfg, uint32_t p)
{
	return p < cfg->nclasses ? cfg->classes[p] : "?";
}

/* A free-form string, quoted when it holds a space (or is empty). */
static void
put_word(allot__buf *b, const char *s)
{
	if (s[0] != '\0' && strpbrk(s, " \t\"") == NULL)
		allot__buf_puts(b, s);
	else
		allot__buf_json(b, s);
}

/* Whether a field's text says what it is without a prefix: a rate, a
 * class and a flag's word ("500/s critical shadow"). */
static bool
names_itself(allot__qtype t)
{
	switch (t) {
	case ALLOT__QT_RATE:
	case ALLOT__QT_CLASS:
	case ALLOT__QT_BOOL: return true;
	case ALLOT__QT_BURST:
	case ALLOT__QT_WORD:
	case ALLOT__QT_TEXT:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_LABELS:
	case ALLOT__QT_CANDIDATE:
	case ALLOT__QT_FRACTION: return false;
	}
	return false;
}

/* Field `f` of quota `q` into `b`: nothing when it has its default, so
 * that the text stays short, or when quotas of its scope (`scope`, of
 * q) do not take it. Rates are written in the quota's unit, except an
 * amount per unit, which is per second. */
static void
put_field(allot__buf *b, const allot_config *cfg, const allot__quota *q,
    const allot__qfield *f, unsigned scope)
{
	if ((f->scopes & scope) == 0)
		return;
	switch (f->type) {
	case ALLOT__QT_RATE:
		put_rate(b, ALLOT__QFC(double, q, f->off), q->unit_s);
		break;
	case ALLOT__QT_BURST: put_num(b, ALLOT__QFC(double, q, f->off)); break;
	case ALLOT__QT_CLASS:
		allot__buf_puts(
		    b, class_name(cfg, ALLOT__QFC(uint32_t, q, f->off)));
		break;
	case ALLOT__QT_BOOL:
		if (ALLOT__QFC(bool, q, f->off) != f->dflt)
			allot__buf_puts(b, f->word);
		break;
	case ALLOT__QT_WORD: {
		int v = ALLOT__QFC(int, q, f->off);
		if (v != 0)
			allot__buf_puts(b, f->words[v]);
		break;
	}
	case ALLOT__QT_TEXT: {
		const char *s = ALLOT__QFC(char *, q, f->off);
		if (s != NULL)
			put_word(b, s);
		break;
	}
	case ALLOT__QT_PER_UNIT: {
		double v = ALLOT__QFC(double, q, f->off);
		if (v > 0)
			put_rate(b, v, 1);
		break;
	}
	case ALLOT__QT_LABELS: {
		char *const *v = ALLOT__QFC(char **, q, f->off);
		size_t n = ALLOT__QFC(size_t, q, f->off2);
		for (size_t i = 0; i < n; i++) {
			if (i > 0)
				allot__buf_puts(b, ",");
			put_word(b, v[i]);
		}
		break;
	}
	case ALLOT__QT_CANDIDATE: {
		double rate = ALLOT__QFC(double, q, f->off);
		if (rate > 0) {
			put_rate(b, rate, q->unit_s);
			allot__buf_puts(b, " burst ");
			put_num(b, ALLOT__QFC(double, q, f->off2));
		}
		break;
	}
	case ALLOT__QT_FRACTION: {
		double v = ALLOT__QFC(double, q, f->off);
		if (v != f->num)
			put_num(b, v);
		break;
	}
	}
}

/* Field `f` as its own string ("" when at its default); NULL on OOM. */
static char *
field_text(const allot_config *cfg, const allot__quota *q,
    const allot__qfield *f, bool def)
{
	allot__buf b = { 0 };
	put_field(&b, cfg, q, f, allot__quota_scope(q, def));
	allot__buf_puts(&b, "");
	if (b.oom) {
		allot__buf_free(&b);
		return NULL;
	}
	/* A diff keeps two texts per quota that changed: their size, not
	 * the buffer's 4 KiB (a 59,001-quota apply held 480 MB of them). */
	char *t = realloc(b.p, b.len + 1);
	return t != NULL ? t : b.p;
}

char *
allot__quota_field_text(
    const allot_config *cfg, const allot__quota *q, const allot__qfield *f)
{
	return field_text(cfg, q, f, q == &cfg->def);
}

/* "500/s burst 1000 critical shadow candidate 400/s burst 800 fallback
 * open owner payments reason \"Q3 launch\" peak 450/s labels
 * team=pay": the fields in table order, each preceded by its prefix. */
static char *
quota_text(const allot_config *cfg, const allot__quota *q, bool def)
{
	/* Each field into one scratch buffer, reused: a diff of 59,001
	 * quotas writes a million fields (issue 27). */
	allot__buf b = { 0 }, t = { 0 };
	unsigned scope = allot__quota_scope(q, def);
	for (size_t i = 0; i < allot__nqfields && !t.oom; i++) {
		const allot__qfield *f = &allot__qfields[i];
		t.len = 0;
		put_field(&t, cfg, q, f, scope);
		if (t.len == 0)
			continue;
		if (b.len > 0)
			allot__buf_puts(&b, " ");
		if (f->prefix != NULL)
			allot__buf_puts(&b, f->prefix);
		else if (!names_itself(f->type))
			allot__buf_printf(&b, "%s ", allot__qfield_label(f));
		allot__buf_put(&b, t.p, t.len);
	}
	allot__buf_puts(&b, "");
	bool oom = b.oom || t.oom;
	allot__buf_free(&t);
	if (oom) {
		allot__buf_free(&b);
		return NULL;
	}
	/* A diff keeps two texts per quota that changed: their size, not
	 * the buffer's. */
	char *s = realloc(b.p, b.len + 1);
	return s != NULL ? s : b.p;
}

char *
allot__quota_text(const allot_config *cfg, const allot__quota *q)
{
	return quota_text(cfg, q, q == &cfg->def);
}

/* "rate 400/s -> 200/s; burst 800 -> 400" for the fields that differ
 * between `a` and `b`, in table order; NULL on OOM. A field set on one
 * side only reads "shadow (none) -> shadow". */
static char *
changed_fields(const allot_config *ca, const allot__quota *a,
    const allot_config *cb, const allot__quota *b, bool def)
{
	allot__buf out = { 0 };
	for (size_t i = 0; i < allot__nqfields && !out.oom; i++) {
		const allot__qfield *f = &allot__qfields[i];
		char *x = field_text(ca, a, f, def);
		char *y = field_text(cb, b, f, def);
		if (x == NULL || y == NULL)
			out.oom = true;
		else if (strcmp(x, y) != 0)
			allot__buf_printf(&out, "%s%s %s -> %s",
			    out.len > 0 ? "; " : "", allot__qfield_label(f),
			    x[0] != '\0' ? x : "(none)",
			    y[0] != '\0' ? y : "(none)");
		free(x);
		free(y);
	}
	allot__buf_puts(&out, "");
	if (out.oom) {
		allot__buf_free(&out);
		return NULL;
	}
	return out.p;
}

/* ---- whole-file settings ---- */

static char *
ceiling_text(const allot_config *cfg)
{
	allot__buf b = { 0 };
	if (cfg->ceiling_rate > 0)
		put_rate(&b, cfg->ceiling_rate, 1);
	else
		allot__buf_puts(&b, "none");
	return b.oom ? (allot__buf_free(&b), NULL) : b.p;
}

static char *
weights_text(const allot_config *cfg)
{
	allot__buf b = { 0 };
	allot__buf_printf(&b, "default %u", cfg->default_weight);
	for (size_t i = 0; i < cfg->nendpoints; i++)
		allot__buf_printf(&b, ", %s %u", cfg->endpoints[i].name,
		    cfg->endpoints[i].weight);
	return b.oom ? (allot__buf_free(&b), NULL) : b.p;
}

static char *
classes_text(const allot_config *cfg)
{
	allot__buf b = { 0 };
	for (size_t i = 0; i < cfg->nclasses; i++)
		allot__buf_printf(&b, "%s%s", i ? "," : "", cfg->classes[i]);
	allot__buf_puts(&b, "");
	return b.oom ? (allot__buf_free(&b), NULL) : b.p;
}

/* ---- the diff ---- */

static char *
dup_or_null(const char *s)
{
	return s != NULL ? strdup(s) : NULL;
}

static void
change_free(allot__quota_change *c)
{
	free(c->service);
	free(c->quota);
	free(c->before);
	free(c->after);
	free(c->fields);
	free(c->owner);
}

void
allot__config_diff_free(allot__config_diff *d)
{
	if (d == NULL)
		return;
	for (size_t i = 0; i < d->n; i++)
		change_free(&d->v[i]);
	free(d->v);
	d->v = NULL;
	d->n = 0;
}

/* Append a change taking ownership of `before`, `after` and `fields`
 * (freed on failure); false on OOM. */
static bool
push(allot__config_diff *d, size_t *cap, allot__change_kind kind,
    const char *quota, char *before, char *after, char *fields,
    const char *owner)
{
	if (d->n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		allot__quota_change *nv = realloc(d->v, nc * sizeof *nv);
		if (nv == NULL)
			goto fail;
		d->v = nv;
		*cap = nc;
	}
	allot__quota_change *c = &d->v[d->n];
	memset(c, 0, sizeof *c);
	c->kind = kind;
	c->quota = strdup(quota);
	c->owner = dup_or_null(owner);
	c->before = before;
	c->after = after;
	c->fields = fields;
	if (c->quota == NULL || (owner != NULL && c->owner == NULL)) {
		change_free(c);
		return false;
	}
	d->n++;
	return true;
fail:
	free(before);
	free(after);
	free(fields);
	return false;
}

/* The callers of one config by wire key, each key formatted once: a
 * diff of files with tens of thousands of quotas looks every quota of
 * one up in the other (issue 27: a scan per lookup, formatting every key
 * it passed, took 23 s for 59,001 quotas against 9,001). */
typedef struct key_index {
	const allot_config *cfg;
	char **keys; /* per caller */
	uint64_t *hash; /* per caller */
	allot__idmap map; /* key hash -> caller */
	uint64_t seed;
} key_index;

static void
index_fini(key_index *x)
{
	if (x->keys != NULL)
		for (size_t i = 0; i < x->cfg->ncallers; i++)
			free(x->keys[i]);
	free(x->keys);
	free(x->hash);
	allot__idmap_fini(&x->map);
	memset(x, 0, sizeof *x);
}

/* `x` for `cfg` (NULL: an empty index); false when out of memory. */
static bool
index_init(key_index *x, const allot_config *cfg)
{
	memset(x, 0, sizeof *x);
	x->cfg = cfg;
	if (cfg == NULL || cfg->ncallers == 0)
		return true;
	size_t n = cfg->ncallers;
	x->keys = calloc(n, sizeof *x->keys);
	x->hash = calloc(n, sizeof *x->hash);
	x->seed = 0x9e3779b97f4a7c15ull;
	if (x->keys == NULL || x->hash == NULL ||
	    allot__idmap_init(&x->map, (uint32_t) n) != ALLOT_OK) {
		index_fini(x);
		return false;
	}
	char buf[512];
	for (size_t i = 0; i < n; i++) {
		allot__quota_key(&cfg->callers[i], buf, sizeof buf);
		x->keys[i] = strdup(buf);
		if (x->keys[i] == NULL) {
			index_fini(x);
			return false;
		}
		x->hash[i] = allot__hash(buf, strlen(buf), x->seed);
		allot__idmap_add(&x->map, x->hash[i], (uint32_t) i);
	}
	return true;
}

/* The quota with wire key `key` in the config `x` indexes, or NULL. */
static const allot__quota *
find_key(const key_index *x, const char *key)
{
	if (x->cfg == NULL)
		return NULL;
	if (strcmp(key, "default") == 0)
		return &x->cfg->def;
	if (x->keys == NULL)
		return NULL;
	uint64_t h = allot__hash(key, strlen(key), x->seed);
	uint32_t pos = allot__idmap_start(&x->map, h), i;
	while ((i = allot__idmap_next(&x->map, h, &pos)) != ALLOT__IDMAP_NONE)
		if (strcmp(x->keys[i], key) == 0)
			return &x->cfg->callers[i];
	return NULL;
}

static const allot__quota *
quota_at(const allot_config *cfg, size_t i)
{
	return i == 0 ? &cfg->def : &cfg->callers[i - 1];
}

/* One quota of `after` against `before` (NULL: none). */
static bool
diff_one(allot__config_diff *d, size_t *cap, const key_index *before_ix,
    const allot_config *after, const allot__quota *q, const char *key)
{
	const allot_config *before = before_ix->cfg;
	bool def = q == &after->def;
	const allot__quota *o = find_key(before_ix, key);
	char *at = quota_text(after, q, def);
	if (at == NULL)
		return false;
	if (o == NULL)
		return push(
		    d, cap, ALLOT__QUOTA_ADDED, key, NULL, at, NULL, q->owner);
	char *bt = quota_text(before, o, def);
	if (bt == NULL) {
		free(at);
		return false;
	}
	if (strcmp(at, bt) == 0) {
		free(at);
		free(bt);
		return true;
	}
	char *f = changed_fields(before, o, after, q, def);
	if (f == NULL) {
		free(at);
		free(bt);
		return false;
	}
	return push(d, cap, ALLOT__QUOTA_CHANGED, key, bt, at, f,
	    q->owner != NULL ? q->owner : o->owner);
}

/* A whole-file setting: `fn` of each side. */
static bool
diff_setting(allot__config_diff *d, size_t *cap, const char *name,
    const allot_config *before, const allot_config *after,
    char *(*fn)(const allot_config *) )
{
	char *at = fn(after);
	char *bt = before != NULL ? fn(before) : NULL;
	if (at == NULL || (before != NULL && bt == NULL)) {
		free(at);
		free(bt);
		return false;
	}
	if (bt != NULL && strcmp(at, bt) == 0) {
		free(at);
		free(bt);
		return true;
	}
	char *f = NULL;
	if (bt != NULL) {
		size_t n = strlen(at) + strlen(bt) + 8;
		f = malloc(n);
		if (f == NULL) {
			free(at);
			free(bt);
			return false;
		}
		snprintf(f, n, "%s -> %s", bt, at);
	}
	return push(d, cap,
	    bt != NULL ? ALLOT__QUOTA_CHANGED : ALLOT__QUOTA_ADDED, name, bt,
	    at, f, NULL);
}

/* Per-service sections (services.NAME in the file). A service's changes are
 * those of its view (allot__config_select) restricted to what its own
 * section sets, so that a top-level change is recorded once, at the top
 * level, not once more per service that inherits it. */

/* Whether service section `s` (NULL: none) sets `key`. */
static bool
section_sets(const allot__service *s, const char *key)
{
	char buf[512];
	if (s == NULL)
		return false;
	if (strcmp(key, "default") == 0)
		return s->def != NULL;
	if (strcmp(key, "(global_ceiling)") == 0)
		return s->ceiling_rate > 0;
	if (strcmp(key, "(endpoint_weights)") == 0)
		return s->nendpoints > 0 || s->default_weight != 0;
	if (key[0] == '(')
		return false; /* the shed order is the file's */
	for (size_t i = 0; i < s->ncallers; i++) {
		allot__quota_key(&s->callers[i], buf, sizeof buf);
		if (strcmp(buf, key) == 0)
			return true;
	}
	return false;
}

static bool
diff_service(allot__config_diff *d, size_t *cap, const allot_config *before,
    const allot_config *after, const char *name)
{
	const allot__service *sb = allot__config_service(before, name);
	const allot__service *sa = allot__config_service(after, name);
	allot_config *vb = NULL, *va = NULL;
	allot__config_diff v = { 0 };
	bool ok = (before == NULL ||
	              allot__config_select(before, name, &vb) == ALLOT_OK) &&
	    allot__config_select(after, name, &va) == ALLOT_OK &&
	    allot__config_diff_compute(vb, va, &v) == ALLOT_OK;
	for (size_t i = 0; ok && i < v.n; i++) {
		allot__quota_change *c = &v.v[i];
		if (!section_sets(sb, c->quota) && !section_sets(sa, c->quota))
			continue;
		ok = push(d, cap, c->kind, c->quota, c->before, c->after,
		    c->fields, c->owner);
		c->before = c->after = c->fields = NULL; /* pushed */
		if (ok) {
			d->v[d->n - 1].service = strdup(name);
			ok = d->v[d->n - 1].service != NULL;
		}
	}
	allot__config_diff_free(&v);
	allot_config_free(vb);
	allot_config_free(va);
	return ok;
}

/* Every service named on either side, after's first. */
static bool
diff_services(allot__config_diff *d, size_t *cap, const allot_config *before,
    const allot_config *after)
{
	bool ok = true;
	for (size_t i = 0; ok && i < after->nservices; i++)
		ok = diff_service(
		    d, cap, before, after, after->services[i].name);
	for (size_t i = 0; ok && before != NULL && i < before->nservices; i++)
		if (allot__config_service(after, before->services[i].name) ==
		    NULL)
			ok = diff_service(
			    d, cap, before, after, before->services[i].name);
	return ok;
}

int
allot__config_diff_compute(const allot_config *before,
    const allot_config *after, allot__config_diff *ret)
{
	allot__config_diff d = { 0 };
	size_t cap = 0;
	key_index bx, ax;
	bool ok = after != NULL;
	bool ix = index_init(&bx, before);
	ix = index_init(&ax, after) && ix;
	ok = ok && ix;
	for (size_t i = 0; ok && i <= after->ncallers; i++) {
		const allot__quota *q = quota_at(after, i);
		ok = diff_one(&d, &cap, &bx, after, q,
		    i == 0 ? "default" : ax.keys[i - 1]);
	}
	for (size_t i = 1; ok && before != NULL && i <= before->ncallers;
	     i++) {
		const allot__quota *q = quota_at(before, i);
		const char *key = bx.keys[i - 1];
		if (find_key(&ax, key) != NULL)
			continue;
		char *bt = quota_text(before, q, false);
		ok = bt != NULL &&
		    push(&d, &cap, ALLOT__QUOTA_REMOVED, key, bt, NULL, NULL,
		        q->owner);
	}
	index_fini(&bx);
	index_fini(&ax);
	ok = ok &&
	    diff_setting(
	        &d, &cap, "(global_ceiling)", before, after, ceiling_text) &&
	    diff_setting(
	        &d, &cap, "(endpoint_weights)", before, after, weights_text) &&
	    diff_setting(
	        &d, &cap, "(shed_order)", before, after, classes_text) &&
	    diff_services(&d, &cap, before, after);
	if (!ok) {
		allot__config_diff_free(&d);
		*ret = (allot__config_diff) { 0 };
		return ALLOT_ENOMEM;
	}
	*ret = d;
	return ALLOT_OK;
}
