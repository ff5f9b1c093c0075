-- paygate schema v14 (PostgreSQL): the audit trail's hash chain (domain::audit_chain). Writers run
-- concurrently and seq is handed out before commit, so seq order is not commit order: a record's
-- chain order is (xid, seq), its inserting transaction then its seq. A sealing run (one at a time:
-- it locks the head) seals only records of transactions older than every running one
-- (xid < pg_snapshot_xmin), a set that can no longer grow, so no record is ever sealed out of order
-- or skipped. Writers pay one column default and one index entry; the hashing is the sealer's.
-- A checkpoint signs a position's hash with the mandate keys (Ed25519). Retention deletes only
-- whole ranges that end at a checkpoint (records and links together).
-- Records written before this migration read as transaction 0 (sealed first, in seq order): a
-- constant default adds the column without rewriting the table; new rows get their own xid.
ALTER TABLE audit_records ADD COLUMN xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE audit_records ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX audit_chain_order ON audit_records (xid, seq);
CREATE TABLE audit_chain (
    chain_seq BIGINT PRIMARY KEY,
    seq       BIGINT NOT NULL UNIQUE,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE TABLE audit_chain_head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    chain_seq BIGINT NOT NULL,
    hash      TEXT NOT NULL,
    -- The last record sealed, in chain order: the next run starts after (last_xid, last_seq).
    last_seq  BIGINT NOT NULL,
    last_xid  xid8 NOT NULL
);
CREATE TABLE audit_checkpoints (
    chain_seq BIGINT PRIMARY KEY,
    hash      TEXT NOT NULL,
    at        BIGINT NOT NULL,
    jws       TEXT NOT NULL
);
