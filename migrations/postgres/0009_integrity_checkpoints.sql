-- paygate schema v9 (PostgreSQL): verified integrity checkpoints, and the transaction id of every
-- posting. An incremental check reads only the postings whose transaction is at or above the newest
-- checkpoint's watermark (a snapshot's xmin: every transaction below it had ended, so nothing below
-- it can still appear). Posting sequence numbers would not do: they are handed out before commit,
-- so a lower one can become visible after a higher one. BRIN: postings are appended, and their
-- transaction ids grow with the table, so a small block-range index finds the recent ones.
ALTER TABLE postings ADD COLUMN txid BIGINT NOT NULL DEFAULT (pg_current_xact_id()::TEXT::BIGINT);
CREATE INDEX postings_txid ON postings USING brin (txid);
CREATE TABLE integrity_checkpoints (
    seq        BIGSERIAL PRIMARY KEY,
    created_at BIGINT NOT NULL,
    body       TEXT NOT NULL
);
