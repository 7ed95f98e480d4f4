-- SPDX-License-Identifier: MIT
-- allot store, migration 4: shadow decisions counted apart from real
-- denials, and what a quota's candidate value would have denied
-- (docs/operations.md, "Tables and views" and "Rolling out a change with
-- a candidate").
--
-- usage.shadow_denied: tokens admitted in shadow that enforcing would
-- have denied. They are part of usage.admitted (the requests were
-- served) and never of usage.denied, which counts only requests refused.
-- usage.candidate_denied: tokens the quota's candidate value would have
-- denied, evaluated by the coordinator over the traffic offered (admitted
-- + denied); usage.candidate_rate: that candidate, tokens/s (NULL when
-- the quota had none in that second).
ALTER TABLE usage ADD COLUMN shadow_denied INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN candidate_denied INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN candidate_rate REAL;

-- Shadow and candidate at a glance: per service, quota and candidate,
-- the would-denies of shadow and of the candidate over the retained
-- history, as a share of the traffic offered (admitted + denied). A
-- quota with neither shows no row; one whose candidate changed shows a
-- row per candidate (candidate_rate NULL: the seconds without one).
CREATE VIEW v_shadow AS
SELECT service,
       quota,
       candidate_rate,
       sum(admitted) AS admitted,
       sum(denied) AS denied,
       sum(shadow_denied) AS shadow_denied,
       round(100.0 * sum(shadow_denied)
           / max(sum(admitted) + sum(denied), 1), 2) AS shadow_denied_pct,
       sum(candidate_denied) AS candidate_denied,
       round(100.0 * sum(candidate_denied)
           / max(sum(admitted) + sum(denied), 1), 2)
           AS candidate_denied_pct,
       datetime(min(at) / 1000, 'unixepoch') AS first,
       datetime(max(at) / 1000, 'unixepoch') AS last,
       min(at) AS first_ms
FROM usage
GROUP BY service, quota, candidate_rate
HAVING sum(shadow_denied) > 0 OR candidate_rate IS NOT NULL;
