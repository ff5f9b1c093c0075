-- Rate quotas kept in the store (GCRA: a bucket's state is its theoretical arrival time, in
-- microseconds of Unix time). One process owns a SQLite store, so the gateway keeps them in memory
-- unless limits.quotas = "shared"; the table keeps the engines' contract one.
CREATE TABLE rate_quotas (
    key    TEXT PRIMARY KEY,
    tat_us INTEGER NOT NULL
) WITHOUT ROWID;
