/* SPDX-License-Identifier: MIT */
/*
 * The regression runner: a main() for a fuzz target built without
 * libFuzzer, linked with one fuzz_*.c. Every argument is a file or a
 * directory (read recursively, in name order, skipping names that start
 * with a dot); each file is read whole into a buffer of exactly its size
 * and given to LLVMFuzzerTestOneInput() once. The normal test run uses it
 * to replay the seed corpus and every input that once crashed a target
 * (tests/fuzz/regressions/<target>/); a failing invariant aborts, which
 * the test reports with the name of the file printed just before. Exits
 * non-zero when an argument cannot be read or no input was found.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_path(const char *path, size_t *count);

static int
replay_file(const char *path, size_t *count)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	for (;;) {
		if (buf == NULL) {
			fprintf(stderr, "replay: %s: out of memory\n", path);
			fclose(f);
			return -1;
		}
		len += fread(buf + len, 1, cap - len, f);
		if (len < cap)
			break;
		cap *= 2;
		uint8_t *nb = realloc(buf, cap);
		if (nb == NULL)
			free(buf);
		buf = nb;
	}
	int err = ferror(f);
	fclose(f);
	if (err) {
		fprintf(stderr, "replay: %s: read error\n", path);
		free(buf);
		return -1;
	}
	/* Exactly `len` bytes, so AddressSanitizer sees an over-read. */
	uint8_t *exact = malloc(len > 0 ? len : 1);
	if (exact == NULL) {
		free(buf);
		return -1;
	}
	memcpy(exact, buf, len);
	free(buf);
	fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	(*count)++;
	return 0;
}

static int
skip_dots(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

static int
replay_dir(const char *path, size_t *count)
{
	struct dirent **names;
	int n = scandir(path, &names, skip_dots, alphasort);
	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	int rc = 0;
	for (int i = 0; i < n; i++) {
		size_t len = strlen(path) + strlen(names[i]->d_name) + 2;
		char *sub = malloc(len);
		if (sub == NULL) {
			rc = -1;
		} else {
			snprintf(sub, len, "%s/%s", path, names[i]->d_name);
			if (replay_path(sub, count) != 0)
				rc = -1;
			free(sub);
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

static int
replay_path(const char *path, size_t *count)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	return S_ISDIR(st.st_mode) ? replay_dir(path, count) :
	                             replay_file(path, count);
}

int
main(int argc, char **argv)
{
	size_t count = 0;
	int rc = 0;
	for (int i = 1; i < argc; i++)
		if (replay_path(argv[i], &count) != 0)
			rc = 1;
	if (count == 0) {
		fprintf(stderr, "replay: no input found\n");
		return 1;
	}
	printf("replayed %zu inputs\n", count);
	return rc;
}
