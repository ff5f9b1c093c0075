//! Passkey rows: people's WebAuthn credentials (the public key stored base64url).

use super::{Columns, Value, corrupt, int, opt_text, text};
use crate::domain::error::StoreError;

pub(crate) const PASSKEY_COLS: &str = "credential_id, owner_iss, owner_sub, public_key, sign_count, \
                                       backup_eligible, name, created_at, revoked_at, revoked_by, rp_id, origin";

pub(crate) fn passkey(r: &dyn Columns) -> Result<crate::domain::approval::PasskeyRecord, StoreError> {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(r.text(3)?)
        .map_err(|_| corrupt("passkeys.public_key"))?;
    Ok(crate::domain::approval::PasskeyRecord {
        credential_id: r.text(0)?,
        owner_iss: r.text(1)?,
        owner_sub: r.text(2)?,
        public_key: key,
        sign_count: r.int(4)?,
        backup_eligible: r.int(5)? != 0,
        name: r.text(6)?,
        created_at: r.int(7)?,
        revoked_at: r.opt_int(8)?,
        revoked_by: r.opt_text(9)?,
        rp_id: r.text(10)?,
        origin: r.text(11)?,
    })
}

/// `PASSKEY_COLS` of a new credential, in order (live: no revocation).
pub(crate) fn passkey_values(p: &crate::domain::approval::PasskeyRecord) -> Vec<Value> {
    use base64::Engine as _;
    vec![
        text(&p.credential_id),
        text(&p.owner_iss),
        text(&p.owner_sub),
        text(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&p.public_key)),
        int(p.sign_count),
        int(i64::from(p.backup_eligible)),
        text(&p.name),
        int(p.created_at),
        Value::Int(p.revoked_at),
        opt_text(p.revoked_by.as_deref()),
        text(&p.rp_id),
        text(&p.origin),
    ]
}
