-- SPDX-License-Identifier: MIT
-- allot store, migration 6: the accounting guarantee (docs/operations.md,
-- "The accounting guarantee"). An agent keeps what it decided, per key
-- and second of its own clock, as numbered Usage records of its account
-- (a random incarnation drawn when it starts) until the coordinator says
-- they are durable; the usage table books each record once, at its
-- second. This table holds, per account, the highest record id booked,
-- in the same transaction as the usage rows it brought: a record re-sent
-- after a timeout, a failover or a restart is recognised and skipped.

CREATE TABLE accounts (
	incarnation INTEGER PRIMARY KEY, -- the agent's account (64 bits)
	last_id INTEGER NOT NULL,        -- the highest Usage id booked
	last_second INTEGER NOT NULL     -- its record's second (ms since the
	                                 -- Unix epoch, the agent's clock)
);

-- The account of each session's agent (NULL: an agent that keeps none,
-- audited from its reports as before).
ALTER TABLE replicas ADD COLUMN incarnation INTEGER;

-- Where the record may be incomplete: replicas whose agent stopped
-- without a Leave (crashed, killed, cut off for good) and whose account
-- reported nothing after: what it decided after its last durable record
-- died with it. One row per account, at its last session; an agent that
-- came back (a later session of the same account) closed its gap
-- itself by sending its records again.
CREATE VIEW v_audit_gaps AS
WITH last_session AS (
	SELECT incarnation, max(session) AS session
	FROM replicas WHERE incarnation IS NOT NULL GROUP BY incarnation
)
SELECT r.service, r.replica_id, r.session,
       printf('%016x', r.incarnation) AS account,
       strftime('%Y-%m-%d %H:%M:%S', coalesce(a.last_second, r.joined_at)
           / 1000.0, 'unixepoch') AS recorded_until,
       strftime('%Y-%m-%d %H:%M:%S', r.left_at / 1000.0, 'unixepoch')
           AS ended_at,
       (r.left_at - max(coalesce(a.last_second, r.joined_at), r.joined_at))
           / 1000 AS seconds,
       r.left_why AS why
FROM last_session l
JOIN replicas r ON r.session = l.session
LEFT JOIN accounts a ON a.incarnation = r.incarnation
WHERE r.left_at IS NOT NULL AND r.left_why <> 'leave'
ORDER BY r.left_at;
