-- SPDX-License-Identifier: MIT
-- allot store, migration 5: the Raft cluster (docs/operations.md,
-- "Cluster"). Every member applies the committed log entries that carry
-- audit rows (the leader's per-second usage, config and membership
-- events) into its own file, each entry in one transaction together with
-- its log index here, so a replay after a crash skips what is already
-- written and any member's file is a complete audit.
CREATE TABLE raft_applied (
	one INTEGER PRIMARY KEY CHECK (one = 1),
	idx INTEGER NOT NULL,           -- the last log index applied
	at INTEGER NOT NULL             -- when (ms since the Unix epoch)
);
INSERT INTO raft_applied (one, idx, at) VALUES (1, 0, 0);
