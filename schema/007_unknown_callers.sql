-- SPDX-License-Identifier: MIT
-- allot store, migration 7: who the unknown callers are (docs/operations.md,
-- "Who was throttled"). Agents charge every identity the quota file does
-- not name to the default quota, so usage rows say "default". Each
-- second allotd also writes the unknown identities that were denied the
-- most (at most 16 a second, sampled from what agents name in their
-- Syncs) as events of kind 'unknown_caller': subject the identity,
-- detail JSON with the service, the endpoint class and the requests
-- admitted and denied. This view sums them per minute.

CREATE VIEW v_unknown_callers AS
SELECT json_extract(detail, '$.service') AS service,
       subject AS identity,
       json_extract(detail, '$.endpoint') AS endpoint,
       datetime((at / 60000) * 60, 'unixepoch') AS minute,
       sum(json_extract(detail, '$.admitted')) AS admitted,
       sum(json_extract(detail, '$.denied')) AS denied,
       (at / 60000) * 60000 AS minute_ms
FROM events
WHERE kind = 'unknown_caller'
GROUP BY service, identity, endpoint, at / 60000;
