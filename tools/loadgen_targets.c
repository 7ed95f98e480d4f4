/* SPDX-License-Identifier: MIT */
/*
 * The load generator's targets: an append-only table of replica URLs
 * (indices stay valid for the counters; a target is switched inactive,
 * never removed) holding the --target URLs and those of the targets
 * file, which the main thread re-reads every second. The workers pick
 * from the active ones under lg.tmu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"
#include "loadgen_engine.h"

#define TARGETS_FILE_MAX (64 * 1024)

int
lg_target_add_locked(const char *url, bool is_static)
{
	for (size_t i = 0; i < lg.ntargets; i++) {
		if (strcmp(lg.turl[i], url) == 0) {
			lg.tactive[i] = true;
			lg.tstatic[i] = lg.tstatic[i] || is_static;
			return (int) i;
		}
	}
	if (lg.ntargets == LG_MAX_TARGETS)
		return -1;
	strcpy(lg.turl[lg.ntargets], url);
	lg.thash[lg.ntargets] = lg_hash_str(url);
	lg.tactive[lg.ntargets] = true;
	lg.tstatic[lg.ntargets] = is_static;
	return (int) lg.ntargets++;
}

static void
targets_warn(void *ctx, size_t line, const char *msg)
{
	fprintf(stderr, PROG ": %s:%zu: %s (line ignored)\n",
	    (const char *) ctx, line, msg);
}

/* Read the whole targets file into a NUL-terminated buffer. */
static char *
slurp(const char *path, bool *ret_missing)
{
	FILE *f = fopen(path, "r");
	char *buf;
	size_t n;

	*ret_missing = f == NULL;
	if (f == NULL)
		return NULL;
	buf = malloc(TARGETS_FILE_MAX + 1);
	if (buf == NULL) {
		fclose(f);
		return NULL;
	}
	n = fread(buf, 1, TARGETS_FILE_MAX, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/*
 * Re-read the targets file; the active set becomes the --target URLs
 * plus the file's. A missing or unreadable file keeps the current set
 * (write the file elsewhere and rename() it into place to change it
 * atomically). Returns false only at start-up, when the file is needed.
 */
bool
lg_targets_reload(bool startup)
{
	static char list[LG_MAX_TARGETS][LG_URL_MAX + 1];
	bool was[LG_MAX_TARGETS];
	bool missing, changed;
	char *text;
	size_t n;
	uint64_t digest;

	if (lg.o.targets_file[0] == '\0')
		return true;
	text = slurp(lg.o.targets_file, &missing);
	if (text == NULL) {
		if (startup) {
			fprintf(stderr,
			    PROG ": cannot read --targets-file "
			         "%s: %s\n",
			    lg.o.targets_file, strerror(errno));
			return false;
		}
		if (!lg.tfile_missing_warned)
			lg_note("t=%.1fs: cannot read %s (%s); keeping the "
			        "current targets",
			    lg_since_start_s(lg_now_ns()), lg.o.targets_file,
			    missing ? "missing" : "out of memory");
		lg.tfile_missing_warned = true;
		return true;
	}
	lg.tfile_missing_warned = false;
	digest = lg_hash_str(text);
	changed = startup || digest != lg.tfile_digest;
	lg.tfile_digest = digest;
	if (!changed) {
		free(text);
		return true;
	}
	n = lg_targets_parse(
	    text, list, LG_MAX_TARGETS, targets_warn, lg.o.targets_file);
	free(text);

	pthread_mutex_lock(&lg.tmu);
	memcpy(was, lg.tactive, sizeof was);
	for (size_t i = 0; i < lg.ntargets; i++) {
		bool keep = lg.tstatic[i];
		for (size_t j = 0; j < n && !keep; j++)
			keep = strcmp(lg.turl[i], list[j]) == 0;
		if (lg.tactive[i] && !keep && !startup)
			lg_note("t=%.1fs: target removed: %s",
			    lg_since_start_s(lg_now_ns()), lg.turl[i]);
		lg.tactive[i] = keep;
	}
	for (size_t j = 0; j < n; j++) {
		bool was_active = false;
		for (size_t i = 0; i < lg.ntargets; i++)
			if (strcmp(lg.turl[i], list[j]) == 0)
				was_active = was[i];
		if (was_active)
			continue;
		if (lg_target_add_locked(list[j], false) < 0) {
			fprintf(stderr,
			    PROG ": more than %d distinct targets "
			         "over the run; %s ignored\n",
			    LG_MAX_TARGETS, list[j]);
			continue;
		}
		if (!startup)
			lg_note("t=%.1fs: target added: %s",
			    lg_since_start_s(lg_now_ns()), list[j]);
	}
	pthread_mutex_unlock(&lg.tmu);
	return true;
}

size_t
lg_targets_active(void)
{
	size_t n = 0;

	pthread_mutex_lock(&lg.tmu);
	for (size_t i = 0; i < lg.ntargets; i++)
		n += lg.tactive[i];
	pthread_mutex_unlock(&lg.tmu);
	return n;
}
