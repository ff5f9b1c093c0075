-- Rate quotas shared by every replica (GCRA: a bucket's state is its theoretical arrival time, in
-- microseconds of Unix time). UNLOGGED: a bucket is written on nearly every agent call, and losing
-- the table in a database crash only refills every bucket once.
CREATE UNLOGGED TABLE rate_quotas (
    key    TEXT PRIMARY KEY,
    tat_us BIGINT NOT NULL
);
