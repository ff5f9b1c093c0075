-- Approvals and their reviews carry the gateway's row tag (domain::audit_chain::row_tag under the
-- audit link key the database never holds): an approval over what it asks as it was created (its
-- intent, amount, agent, expiry, reviewers, approver, passkey tier), a review over its approval id
-- and every stored field. An approval whose tag does not hold, or holding a review a database
-- writer inserted, edited or copied, is decided no further (domain::rules::review::altered).
-- Rows from before tags carry none: an approval pending across the upgrade cannot be decided and
-- expires (its agent asks again).
ALTER TABLE approvals ADD COLUMN tag TEXT;
ALTER TABLE approval_reviews ADD COLUMN tag TEXT;
