-- paygate schema v12 (SQLite): payees (beneficiaries). A payee (a ledger account, a customer's
-- phone account such as mpesa-2547…) becomes known to an owner (the agent, or the agent acting for
-- one user: the budget's subject) when a human approves a payment to it or an operator adds it;
-- an operator may revoke it. The row is kept after a revoke (who, when) and renewed by a new approval.
CREATE TABLE payees (
    owner       TEXT NOT NULL,
    payee       TEXT NOT NULL,
    known_since INTEGER NOT NULL,
    added_by    TEXT NOT NULL,
    approval_id TEXT,
    revoked_at  INTEGER,
    revoked_by  TEXT,
    PRIMARY KEY (owner, payee)
);
CREATE INDEX payees_by_time ON payees (known_since DESC);
-- What an owner's autonomous payments to one payee total per UTC day: the daily cap's usage,
-- checked and written where each payment commits, under the owner's budget lock.
CREATE TABLE payee_usage (
    owner       TEXT NOT NULL,
    payee       TEXT NOT NULL,
    day         INTEGER NOT NULL,
    currency    TEXT NOT NULL,
    spent_minor INTEGER NOT NULL,
    payments    INTEGER NOT NULL,
    PRIMARY KEY (owner, payee, day, currency)
);
