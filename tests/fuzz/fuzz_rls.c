/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "rls": allot-agentd's request decoder (sidecar/rls.c). The
 * input is the message of one ShouldRateLimit call (a RateLimitRequest in
 * protobuf wire format, without the gRPC prefix), decided against a
 * local agent with two callers. Checked: a request is answered or
 * refused with a gRPC status and a message; an answer carries its 5-byte
 * prefix room and decodes as a RateLimitResponse with one status per
 * descriptor, each OK or OVER_LIMIT, the overall code OVER_LIMIT exactly
 * when one of them is; a refusal is INVALID_ARGUMENT (or, for a cost
 * above the burst, never a crash). Bounds of the mapping are small so
 * that the limits are reached.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "agentd.h"
#include "fuzz.h"
#include "rls.pb-c.h"

static allot_agent *agent;
static struct rls_map map;

static void
setup(void)
{
	static const char yaml[] =
	    "quotas:\n"
	    "  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: 5, burst: 10}\n"
	    "    - {identity: b, tokens_per_second: 0.5, burst: 3, "
	    "shadow: true}\n"
	    "  endpoint_weights: {default: 1, /x: 3}\n";
	allot_config *cfg;
	if (allot_config_parse("fuzz", yaml, sizeof yaml - 1, NULL, 0, &cfg) !=
	        ALLOT_OK ||
	    allot_agent_create(cfg, NULL, &agent) != ALLOT_OK)
		abort();
	allot_config_free(cfg);
	struct agentd_options o;
	memset(&o, 0, sizeof o);
	o.identity_keys = "caller,id";
	o.endpoint_keys = "endpoint";
	o.unknown = "default";
	o.max_descriptors = 8;
	o.max_entries = 8;
	/* Descriptors' own limits charged too (sidecar/limits.c), in a
	 * small table: inputs with many limits evict. */
	o.descriptor_limits = "cap";
	o.max_descriptor_limits = 16;
	char err[128];
	if (!agentd_map_init(&map, &o, err, sizeof err))
		abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (agent == NULL)
		setup();
	uint8_t *out = NULL;
	size_t len = 0;
	char msg[160];
	msg[0] = '\0';
	int rc = agentd_rls(
	    agent, &map, data, size, &out, &len, msg, sizeof msg);
	if (rc != 0) {
		FUZZ_CHECK(out == NULL && msg[0] != '\0');
		FUZZ_CHECK(rc == 3 || rc == 8 || rc == 13);
		return 0;
	}
	FUZZ_CHECK(out != NULL && len >= 5);
	Envoy__Service__Ratelimit__V3__RateLimitRequest *rq =
	    envoy__service__ratelimit__v3__rate_limit_request__unpack(
	        NULL, size, data);
	Envoy__Service__Ratelimit__V3__RateLimitResponse *r =
	    envoy__service__ratelimit__v3__rate_limit_response__unpack(
	        NULL, len - 5, out + 5);
	FUZZ_CHECK(rq != NULL && r != NULL);
	FUZZ_CHECK(r->n_statuses == rq->n_descriptors);
	bool over = false;
	for (size_t i = 0; i < r->n_statuses; i++) {
		int c = r->statuses[i]->code;
		FUZZ_CHECK(c == 1 || c == 2);
		over = over || c == 2;
	}
	FUZZ_CHECK(r->overall_code == (over ? 2 : 1));
	FUZZ_CHECK(r->n_response_headers_to_add <= 3);
	envoy__service__ratelimit__v3__rate_limit_response__free_unpacked(
	    r, NULL);
	envoy__service__ratelimit__v3__rate_limit_request__free_unpacked(
	    rq, NULL);
	free(out);
	return 0;
}
