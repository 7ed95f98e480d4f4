/* SPDX-License-Identifier: MIT */
/*
 * The one rule for names (name.h), shared by the config loader, the
 * coordinator's wire check and the store.
 */
#include "name.h"

bool
allot__name_valid(const char *s, size_t max, bool required)
{
	if (s == NULL)
		return !required;
	size_t n = 0;
	for (; s[n] != '\0'; n++) {
		unsigned char c = (unsigned char) s[n];
		if (c < 0x20 || c > 0x7e || n >= max)
			return false;
	}
	return n > 0 || !required;
}
