-- paygate schema v19 (SQLite): the cooling-off total (issue 52). What an owner's autonomous
-- payments to one payee total during its cooling-off period, per currency, kept under the time it
-- became known (a payee known again starts a new period): checked and written where each payment
-- commits, under the owner's budget lock, like the daily cap's payee_usage.
CREATE TABLE payee_cooling_usage (
    owner       TEXT NOT NULL,
    payee       TEXT NOT NULL,
    known_since INTEGER NOT NULL,
    currency    TEXT NOT NULL,
    spent_minor INTEGER NOT NULL,
    payments    INTEGER NOT NULL,
    PRIMARY KEY (owner, payee, known_since, currency)
);
-- Revoking a mandate forgets the payee its settled payment taught: found by its approval.
CREATE INDEX payees_by_approval ON payees (approval_id);
-- Payees learned before this version were learned when their mandate was issued: those whose
-- mandate was since revoked, or never drawn on, are forgotten now (a settled payment teaches them
-- again). A paybill payee known by its number alone now matches no payment (a paybill payee is the
-- pair paybill/account reference): it is left as it was, inert.
UPDATE payees SET revoked_at = CAST(strftime('%s', 'now') AS INTEGER), revoked_by = 'migration 0021: its mandate was revoked or never used'
WHERE revoked_at IS NULL AND approval_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM mandates m WHERE m.approval_id = payees.approval_id AND m.revoked_at IS NULL AND m.uses > 0);
