-- Payees carry the gateway's row tag (domain::audit_chain::row_tag over owner, payee, known_since,
-- added_by and approval_id, under the audit link key the database never holds): a row a database
-- writer inserted or edited makes no payee known (gateway::payees::payee_tag_holds). Rows from
-- before tags carry none and are known no more: an operator adds them again.
ALTER TABLE payees ADD COLUMN tag TEXT;
