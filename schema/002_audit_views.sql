-- SPDX-License-Identifier: MIT
-- allot store, migration 2: the audit views operators query with the
-- sqlite3 shell (docs/operations.md has the cookbook). They only read the
-- tables of 001_initial.sql; times are shown as UTC text next to the raw
-- millisecond columns (*_ms), which are the ones to filter on; "now" is
-- julianday('now') in milliseconds (strftime('%s') has whole seconds
-- only). A later migration that changes a view drops and recreates it.

-- Who consumed what, per minute.
CREATE VIEW v_consumption_per_minute AS
SELECT service,
       quota,
       datetime((at / 60000) * 60, 'unixepoch') AS minute,
       sum(admitted) AS admitted,
       sum(denied) AS denied,
       round(sum(demand), 3) AS demand,
       max(live_replicas) AS max_replicas,
       (at / 60000) * 60000 AS minute_ms
FROM usage
GROUP BY service, quota, at / 60000;

-- Who was denied and how much: totals over the retained history, the
-- share of requests denied, and the average denial rate over the seconds
-- in which the quota was used.
CREATE VIEW v_denied AS
SELECT service,
       quota,
       sum(denied) AS denied,
       sum(admitted) AS admitted,
       round(100.0 * sum(denied) / max(sum(admitted) + sum(denied), 1), 2)
           AS denied_pct,
       round(1.0 * sum(denied) / count(*), 3) AS denied_per_s,
       datetime(min(CASE WHEN denied > 0 THEN at END) / 1000, 'unixepoch')
           AS first_denied,
       datetime(max(CASE WHEN denied > 0 THEN at END) / 1000, 'unixepoch')
           AS last_denied
FROM usage
GROUP BY service, quota
HAVING sum(denied) > 0
ORDER BY sum(denied) DESC;

-- Each change of a replica's share of a quota, with the replica named.
CREATE VIEW v_share_history AS
SELECT datetime(h.at / 1000, 'unixepoch') AS at,
       h.service,
       h.quota,
       h.session,
       r.replica_id,
       r.host,
       h.rate,
       h.burst,
       datetime(h.lease_until / 1000, 'unixepoch') AS lease_until,
       h.at AS at_ms
FROM share_history AS h
LEFT JOIN replicas AS r ON r.session = h.session;

-- Replica churn per minute and service: joins and each kind of leave.
CREATE VIEW v_replica_churn AS
SELECT datetime(m * 60, 'unixepoch') AS minute,
       service,
       sum(kind = 'join') AS joins,
       sum(kind = 'leave') AS leaves,
       sum(kind = 'expired') AS expiries,
       sum(kind = 'replaced') AS replaced,
       sum(kind = 'shutdown') AS shutdowns,
       m * 60000 AS minute_ms
FROM (SELECT joined_at / 60000 AS m, service, 'join' AS kind
      FROM replicas
      UNION ALL
      SELECT left_at / 60000, service, left_why
      FROM replicas
      WHERE left_at IS NOT NULL)
GROUP BY m, service;

-- Every session with its lifetime (to its leave, or to now while live).
CREATE VIEW v_replica_lifetime AS
SELECT session,
       replica_id,
       service,
       host,
       pid,
       agent_version,
       datetime(joined_at / 1000, 'unixepoch') AS joined,
       datetime(left_at / 1000, 'unixepoch') AS left,
       left_why,
       round((coalesce(left_at,
           (julianday('now') - 2440587.5) * 86400000.0) - joined_at)
           / 1000.0, 1) AS lifetime_s,
       joined_at AS joined_ms
FROM replicas;

-- Sessions without a leave: live as far as the coordinator last knew.
-- silent_s is how long ago the last sync was (rows of a coordinator that
-- is down age here until it restarts and expires them).
CREATE VIEW v_live_replicas AS
SELECT session,
       replica_id,
       service,
       host,
       pid,
       agent_version,
       config_digest,
       datetime(joined_at / 1000, 'unixepoch') AS joined,
       datetime(last_seen / 1000, 'unixepoch') AS last_seen,
       round(((julianday('now') - 2440587.5) * 86400000.0 - last_seen)
           / 1000.0, 1) AS silent_s
FROM replicas
WHERE left_at IS NULL;

-- Events with readable times (millisecond precision).
CREATE VIEW v_events AS
SELECT strftime('%Y-%m-%d %H:%M:%f', at / 1000.0, 'unixepoch') AS at,
       kind,
       subject,
       detail,
       at AS at_ms
FROM events;

-- Configuration loads, without the (possibly long) content.
CREATE VIEW v_configs AS
SELECT epoch,
       digest,
       path,
       length(content) AS bytes,
       datetime(loaded_at / 1000, 'unixepoch') AS loaded,
       loaded_at AS loaded_ms
FROM configs;

-- The last recorded global bucket level of each quota.
CREATE VIEW v_levels AS
SELECT service,
       quota,
       round(level, 3) AS level,
       datetime(at / 1000, 'unixepoch') AS at,
       at AS at_ms
FROM levels;
