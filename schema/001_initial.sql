-- SPDX-License-Identifier: MIT
-- allot store, migration 1: the tables. allotd applies the files of this
-- folder in order inside one transaction each and sets PRAGMA user_version
-- to the number of the last one applied; a file is never edited once
-- released (add 00N_*.sql instead). Every time is an integer count of
-- milliseconds since the Unix epoch taken from the coordinator's wall
-- clock: audit only, never used for rate arithmetic. The audit views of
-- 002_audit_views.sql render them as UTC text.

-- One row per agent session (a replica between its join and its leave).
-- left_at IS NULL means live as far as the coordinator last knew; at
-- start-up allotd restores those rows and expires the ones that do not
-- come back.
CREATE TABLE replicas (
	session INTEGER PRIMARY KEY,
	replica_id TEXT NOT NULL,
	service TEXT NOT NULL,
	host TEXT,
	pid INTEGER,
	agent_version TEXT,
	config_digest TEXT,             -- 16 hex digits
	joined_at INTEGER NOT NULL,
	last_seen INTEGER NOT NULL,
	left_at INTEGER,
	left_why TEXT CHECK (left_why IN
	    ('leave', 'expired', 'replaced', 'shutdown'))
);
CREATE INDEX replicas_live ON replicas (session) WHERE left_at IS NULL;
CREATE INDEX replicas_service ON replicas (service, joined_at);

-- Every configuration load, with the file as it was read.
CREATE TABLE configs (
	id INTEGER PRIMARY KEY,
	epoch INTEGER NOT NULL,
	digest TEXT NOT NULL,           -- 16 hex digits
	path TEXT,
	content TEXT,
	loaded_at INTEGER NOT NULL
);

-- The allowance each live session holds for each quota now (upserted;
-- deleted when the session leaves). Changes are appended to
-- share_history by the triggers below.
CREATE TABLE shares (
	session INTEGER NOT NULL,
	service TEXT NOT NULL,
	quota TEXT NOT NULL,
	rate REAL NOT NULL,             -- tokens per second
	burst REAL NOT NULL,            -- tokens
	lease_until INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (session, service, quota)
) WITHOUT ROWID;

CREATE TABLE share_history (
	id INTEGER PRIMARY KEY,
	at INTEGER NOT NULL,
	session INTEGER NOT NULL,
	service TEXT NOT NULL,
	quota TEXT NOT NULL,
	rate REAL NOT NULL,
	burst REAL NOT NULL,
	lease_until INTEGER NOT NULL
);
CREATE INDEX share_history_key ON share_history (service, quota, at);
CREATE INDEX share_history_at ON share_history (at);

-- A share "changes" when its rate or burst moves by more than float noise
-- (one part in a million); lease extensions alone are not history.
CREATE TRIGGER shares_history_insert AFTER INSERT ON shares
BEGIN
	INSERT INTO share_history (at, session, service, quota, rate, burst,
	    lease_until)
	VALUES (new.updated_at, new.session, new.service, new.quota, new.rate,
	    new.burst, new.lease_until);
END;
CREATE TRIGGER shares_history_update AFTER UPDATE OF rate, burst ON shares
WHEN abs(new.rate - old.rate) > 1e-6 * max(abs(old.rate), 1.0)
  OR abs(new.burst - old.burst) > 1e-6 * max(abs(old.burst), 1.0)
BEGIN
	INSERT INTO share_history (at, session, service, quota, rate, burst,
	    lease_until)
	VALUES (new.updated_at, new.session, new.service, new.quota, new.rate,
	    new.burst, new.lease_until);
END;

-- Consumption per service, quota and wall-clock second (at is the start
-- of the second). Reports are summed in memory before they are written,
-- and a second written twice is added to (admitted, denied and demand are
-- sums; live_replicas is the largest count seen in the second). The
-- biggest table by far, so it is clustered by time with no other index:
-- rows are appended in key order, time windows and retention are range
-- scans, and each row is stored once (about 80 bytes).
CREATE TABLE usage (
	at INTEGER NOT NULL,
	service TEXT NOT NULL,
	quota TEXT NOT NULL,
	admitted INTEGER NOT NULL DEFAULT 0,
	denied INTEGER NOT NULL DEFAULT 0,
	demand REAL NOT NULL DEFAULT 0,
	live_replicas INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (at, service, quota)
) WITHOUT ROWID;

-- Things that happened: joins, leaves, expiries, config loads, fallback,
-- rejected messages, start and stop.
CREATE TABLE events (
	id INTEGER PRIMARY KEY,
	at INTEGER NOT NULL,
	kind TEXT NOT NULL,
	subject TEXT,
	detail TEXT
);
CREATE INDEX events_at ON events (at);
CREATE INDEX events_kind ON events (kind, at);

-- The last known level (tokens) of each quota's global bucket.
CREATE TABLE levels (
	service TEXT NOT NULL,
	quota TEXT NOT NULL,
	level REAL NOT NULL,
	at INTEGER NOT NULL,
	PRIMARY KEY (service, quota)
) WITHOUT ROWID;
