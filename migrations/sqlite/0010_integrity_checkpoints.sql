-- paygate schema v10 (SQLite): verified integrity checkpoints. Each body is a JSON checkpoint
-- (watermark = the first posting seq it does not cover, per-account sums below it); an incremental
-- check reads only the postings from the newest one's watermark on.
CREATE TABLE integrity_checkpoints (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at INTEGER NOT NULL,
    body       TEXT NOT NULL
);
