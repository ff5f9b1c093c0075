-- paygate schema v14 (SQLite): the audit trail's hash chain (domain::audit_chain). A sealing run
-- (the seal_audit job) gives each committed audit record, in seq order (one writer: seq order is
-- commit order), a dense chain position, the previous link's hash and its own; the head is the
-- newest link. A checkpoint signs a position's hash with the mandate keys (Ed25519). Retention
-- deletes only whole ranges that end at a checkpoint (records and links together); the walk then
-- starts right after that checkpoint.
CREATE TABLE audit_chain (
    chain_seq INTEGER PRIMARY KEY,
    seq       INTEGER NOT NULL UNIQUE,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE TABLE audit_chain_head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    chain_seq INTEGER NOT NULL,
    hash      TEXT NOT NULL,
    -- The last record sealed: the next run starts after it.
    last_seq  INTEGER NOT NULL
);
CREATE TABLE audit_checkpoints (
    chain_seq INTEGER PRIMARY KEY,
    hash      TEXT NOT NULL,
    at        INTEGER NOT NULL,
    jws       TEXT NOT NULL
);
