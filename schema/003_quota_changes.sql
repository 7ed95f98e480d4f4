-- SPDX-License-Identifier: MIT
-- allot store, migration 3: who changed which quota, when and why. Every
-- config allotd installs that differs from the one in force (an apply on
-- the admin socket, a SIGHUP reload, a start with a changed file, the
-- first config of an empty store) is one row of config_changes, and each
-- quota it added, removed or changed one row of quota_changes. Rows are
-- never updated, and retention does not delete them.

-- One installed change of the quota config.
CREATE TABLE config_changes (
	id INTEGER PRIMARY KEY,
	at INTEGER NOT NULL,            -- ms since the Unix epoch
	epoch INTEGER NOT NULL,         -- the epoch it installed
	digest TEXT NOT NULL,           -- 16 hex digits, of the new config
	-- Who: the user name the kernel gave for the admin socket's peer
	-- (SO_PEERCRED), or 'signal' (SIGHUP reload), or 'start' (allotd
	-- started with a file that differs from the last one recorded, or
	-- with an empty store).
	who TEXT NOT NULL,
	claimed_as TEXT,                -- allotctl apply --as: not verified
	reason TEXT NOT NULL,
	source TEXT                     -- the file name the client gave
);
CREATE INDEX config_changes_at ON config_changes (at);

-- One quota added, removed or changed by a config change. before and
-- after are the quota as one line of text ("500/s burst 1000 critical
-- owner payments"); NULL when it did not exist on that side. Whole-file
-- settings appear as quotas in parentheses: (global_ceiling),
-- (endpoint_weights), (shed_order).
CREATE TABLE quota_changes (
	id INTEGER PRIMARY KEY,
	change INTEGER NOT NULL REFERENCES config_changes (id),
	service TEXT,                   -- NULL: the top level of the file
	quota TEXT NOT NULL,
	action TEXT NOT NULL CHECK (action IN ('added', 'removed', 'changed')),
	before TEXT,
	after TEXT,
	fields TEXT,                    -- changed: "rate 400/s -> 200/s; ..."
	owner TEXT                      -- the quota's metadata owner
);
CREATE INDEX quota_changes_change ON quota_changes (change);
CREATE INDEX quota_changes_quota ON quota_changes (quota, change);

-- Each quota change with when, who and why, oldest first.
CREATE VIEW v_quota_changes AS
SELECT datetime(c.at / 1000, 'unixepoch') AS at,
       c.who || coalesce(' (as ' || c.claimed_as || ', claimed)', '')
           AS who,
       q.service,
       q.quota,
       q.action,
       q.before,
       q.after,
       c.reason,
       q.owner,
       c.epoch,
       c.digest,
       q.fields,
       c.at AS at_ms
FROM quota_changes AS q
JOIN config_changes AS c ON c.id = q.change
ORDER BY c.at, q.id;
