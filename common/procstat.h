/* SPDX-License-Identifier: MIT */
/*
 * The process metrics every Prometheus exporter writes (the client
 * libraries' process collector): CPU time, memory, descriptors and start
 * time of this process, read from /proc, as the text exposition format.
 * allotd and allot-agentd write them on /metrics; in the archive of what
 * the daemons share (opts_dep), as allot-agentd links nothing else of
 * common/.
 */
#ifndef ALLOT_COMMON_PROCSTAT_H
#define ALLOT_COMMON_PROCSTAT_H

#include <stddef.h>

/* process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds and
 * process_start_time_seconds, with HELP and TYPE lines, into `buf`
 * (`len` bytes, NUL-terminated; 4 KiB is ample). A figure /proc does not
 * give is left out. Returns the length written. */
size_t allot__procstat_text(char *buf, size_t len);

#endif
