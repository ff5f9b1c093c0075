-- Approval reviews carry the gateway's row tag (domain::audit_chain::row_tag over the approval id
-- and every stored field of the review, under the audit link key the database never holds): an
-- approval holding a review a database writer inserted, edited or copied is decided no further
-- (domain::rules::review::altered). Reviews from before tags carry none: an approval pending across
-- the upgrade with a review already on it cannot be decided, and expires (its agent asks again).
ALTER TABLE approval_reviews ADD COLUMN tag TEXT;
