#!/bin/sh
# SPDX-License-Identifier: MIT
# Fails when liballot (or liballot-jwt) exports a symbol that is not part
# of the public API: every dynamic symbol it defines must start with
# allot_ and be declared in a public header. The third argument is the
# fewest public symbols expected (default 21).
set -eu
lib="$1"
headers="$2"
least="${3:-21}"
bad=0
for sym in $(nm -D --defined-only "$lib" | awk '{print $3}'); do
	case "$sym" in
	allot_*)
		if ! grep -rqw "$sym" "$headers"; then
			echo "exported but not declared in $headers: $sym"
			bad=1
		fi
		;;
	_init|_fini|__bss_start|_edata|_end) ;;
	*)
		echo "unexpected export: $sym"
		bad=1
		;;
	esac
done
count=$(nm -D --defined-only "$lib" | grep -c ' allot_' || true)
[ "$count" -ge "$least" ] || { echo "only $count allot_ symbols exported"; bad=1; }
[ "$bad" -eq 0 ] && echo "exports ok: $count public symbols"
exit "$bad"
