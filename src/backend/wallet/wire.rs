//! The wallet service's wire format, and only here: its JSON bodies, its payment statuses and its
//! RFC 7807 problem details, turned into rail-neutral terms (`WalletStatus`, `Refusal`).
//!
//! The service tells its three 422s apart only by the problem's `detail` text, so that text is
//! matched here, by the sentences the service writes (its `InsufficientFundsException`,
//! `IdempotencyMismatchException`, `RefundNotAllowedException`). A detail none of them matches is
//! `Refusal::Unrecognised`: never success, never "nothing moved".

use serde::Deserialize;

use crate::domain::payment::PaymentStatus;

/// A UUID as the service writes it (`8-4-4-4-12` hex digits), kept lower-case. The service names
/// accounts, payments and refunds by them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WalletUuid(String);

impl WalletUuid {
    pub fn parse(s: &str) -> Result<Self, String> {
        let groups: Vec<&str> = s.split('-').collect();
        let lens = [8, 4, 4, 4, 12];
        let ok = groups.len() == lens.len()
            && groups.iter().zip(lens).all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
        if ok { Ok(WalletUuid(s.to_ascii_lowercase())) } else { Err(format!("{s:?} is not a UUID")) }
    }

    /// The 32 hex digits without dashes (the gateway's reference for it: `pay_<hex>`).
    pub fn hex(&self) -> String {
        self.0.replace('-', "")
    }

    /// From 32 hex digits (a `pay_<hex>` reference), the inverse of [`WalletUuid::hex`].
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let h = hex.to_ascii_lowercase();
        Some(WalletUuid(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for WalletUuid {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        WalletUuid::parse(&s)
    }
}

impl<'de> Deserialize<'de> for WalletUuid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        WalletUuid::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `POST /v1/payments` and `GET /v1/payments/{id}`: the service's view of a payment (it names no
/// accounts).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WirePayment {
    pub id: WalletUuid,
    pub status: String,
    pub amount: i64,
    pub currency: String,
}

/// `POST /v1/payments/{id}/refunds`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireRefund {
    pub id: WalletUuid,
    pub payment_id: WalletUuid,
    pub amount: i64,
    pub status: String,
}

/// `GET /v1/accounts/{id}/balance`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireBalance {
    pub account_id: WalletUuid,
    pub balance: i64,
    pub currency: String,
}

/// One line of `GET /v1/accounts/{id}/ledger` (newest first).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireEntry {
    pub id: i64,
    pub transaction_id: Option<WalletUuid>,
    pub direction: String,
    pub amount: i64,
    pub created_at: Option<String>,
}

/// `GET /v1/reconciliation/report`. `balanced` may be absent (the service's record computes it
/// from the other two); when present it must agree.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireReport {
    pub balanced: Option<bool>,
    pub ledger_net: i64,
    #[serde(default)]
    pub drifted_accounts: Vec<String>,
}

impl WireReport {
    pub fn balanced(&self) -> bool {
        self.ledger_net == 0 && self.drifted_accounts.is_empty() && self.balanced != Some(false)
    }
}

/// Where a payment stands by the service's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalletStatus {
    /// The payee was credited (refunds since are payments of their own).
    Settled,
    /// Reversed: the payer has the money back.
    Failed,
    /// The saga has not finished (created, processing, funds locked, authorized).
    InFlight,
    /// A status this gateway does not know: never success; pending until the service says more.
    Unrecognised,
}

impl WalletStatus {
    pub fn parse(s: &str) -> Self {
        match s {
            "SUCCEEDED" | "PARTIALLY_REFUNDED" | "REFUNDED" => WalletStatus::Settled,
            "FAILED" => WalletStatus::Failed,
            "CREATED" | "PROCESSING" | "FUNDS_LOCKED" | "AUTHORIZED" => WalletStatus::InFlight,
            _ => WalletStatus::Unrecognised,
        }
    }

    pub fn payment_status(self) -> PaymentStatus {
        match self {
            WalletStatus::Settled => PaymentStatus::Succeeded,
            WalletStatus::Failed => PaymentStatus::Failed,
            WalletStatus::InFlight | WalletStatus::Unrecognised => PaymentStatus::Pending,
        }
    }
}

/// An RFC 7807 problem; absent fields are empty.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Problem {
    pub status: Option<u16>,
    pub title: String,
    pub detail: String,
}

impl Problem {
    pub fn parse(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_default()
    }
}

/// What a refusal of a money-moving request means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 404 naming a payment.
    PaymentNotFound,
    /// 404 naming nothing the service knows: no such route (a wrong base URL).
    NoSuchRoute,
    /// 409: a request under this key is running at the service; it may still commit.
    InProgress,
    /// 422 "insufficient funds in account <uuid>: balance=<minor>, attempted debit=<minor>".
    InsufficientFunds { account: Option<WalletUuid>, balance: Option<i64>, needed: Option<i64> },
    /// 422 "idempotency key '…' was already used with a different request body".
    KeyReused,
    /// 422 "payment … is not refundable in status …".
    NotRefundable,
    /// 422 "refund <minor> exceeds the remaining refundable amount <minor>".
    RefundExceedsRemaining { requested: Option<i64>, remaining: Option<i64> },
    /// 400: refused as malformed before anything was applied.
    Malformed,
    /// Anything else (another status, a 422 detail none of the above): maybe applied.
    Unrecognised,
}

/// The refusal a status and problem mean; the one `match` over the service's refusals.
pub fn refusal(status: u16, problem: &Problem) -> Refusal {
    let d = problem.detail.as_str();
    match status {
        404 if d.starts_with("payment not found") => Refusal::PaymentNotFound,
        404 => Refusal::NoSuchRoute,
        409 => Refusal::InProgress,
        422 if d.starts_with("insufficient funds in account ") => Refusal::InsufficientFunds {
            account: d
                .strip_prefix("insufficient funds in account ")
                .and_then(|r| r.split(':').next())
                .and_then(|a| WalletUuid::parse(a.trim()).ok()),
            balance: number_after(d, "balance="),
            needed: number_after(d, "attempted debit="),
        },
        422 if d.starts_with("idempotency key ") && d.ends_with("was already used with a different request body") => {
            Refusal::KeyReused
        }
        422 if d.starts_with("payment ") && d.contains(" is not refundable in status ") => Refusal::NotRefundable,
        422 if d.starts_with("refund ") && d.contains(" exceeds the remaining refundable amount ") => {
            Refusal::RefundExceedsRemaining {
                requested: d.strip_prefix("refund ").and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()),
                remaining: number_after(d, "remaining refundable amount "),
            }
        }
        400 => Refusal::Malformed,
        _ => Refusal::Unrecognised,
    }
}

/// The integer right after `label` in `text`.
fn number_after(text: &str, label: &str) -> Option<i64> {
    let rest = &text[text.find(label)? + label.len()..];
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(detail: &str) -> Problem {
        Problem { status: None, title: String::new(), detail: detail.into() }
    }

    #[test]
    fn uuids_round_trip_through_their_hex() {
        let u = WalletUuid::parse("6F1C2A3B-0000-4000-8000-00000000000A").unwrap();
        assert_eq!(u.as_str(), "6f1c2a3b-0000-4000-8000-00000000000a");
        assert_eq!(WalletUuid::from_hex(&u.hex()), Some(u));
        for bad in ["", "6f1c2a3b00004000800000000000000a", "6f1c2a3b-0000-4000-8000-00000000000g", "a-b-c-d-e"] {
            assert!(WalletUuid::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(WalletUuid::from_hex("abc"), None);
    }

    #[test]
    fn every_status_maps_and_none_unknown_is_success() {
        for (s, want) in [
            ("SUCCEEDED", PaymentStatus::Succeeded),
            ("PARTIALLY_REFUNDED", PaymentStatus::Succeeded),
            ("REFUNDED", PaymentStatus::Succeeded),
            ("FAILED", PaymentStatus::Failed),
            ("CREATED", PaymentStatus::Pending),
            ("PROCESSING", PaymentStatus::Pending),
            ("FUNDS_LOCKED", PaymentStatus::Pending),
            ("AUTHORIZED", PaymentStatus::Pending),
            ("SETTLED_MAYBE", PaymentStatus::Pending),
            ("succeeded", PaymentStatus::Pending),
        ] {
            assert_eq!(WalletStatus::parse(s).payment_status(), want, "{s}");
        }
    }

    #[test]
    fn the_three_422s_are_told_apart_by_their_detail() {
        let u = "6f1c2a3b-0000-4000-8000-00000000000a";
        assert_eq!(
            refusal(422, &problem(&format!("insufficient funds in account {u}: balance=100, attempted debit=250"))),
            Refusal::InsufficientFunds { account: WalletUuid::parse(u).ok(), balance: Some(100), needed: Some(250) }
        );
        assert_eq!(
            refusal(422, &problem("idempotency key 'idk_1' was already used with a different request body")),
            Refusal::KeyReused
        );
        assert_eq!(
            refusal(422, &problem(&format!("payment {u} is not refundable in status FAILED"))),
            Refusal::NotRefundable
        );
        assert_eq!(
            refusal(422, &problem("refund 500 exceeds the remaining refundable amount 300")),
            Refusal::RefundExceedsRemaining { requested: Some(500), remaining: Some(300) }
        );
        // A detail the service never wrote is not a known refusal.
        assert_eq!(refusal(422, &problem("limit reached")), Refusal::Unrecognised);
        assert_eq!(refusal(422, &Problem::parse(b"<html>")), Refusal::Unrecognised);
        assert_eq!(
            refusal(409, &problem("a request with idempotency key 'k' is already in progress")),
            Refusal::InProgress
        );
        assert_eq!(refusal(404, &problem(&format!("payment not found: {u}"))), Refusal::PaymentNotFound);
        assert_eq!(refusal(404, &problem("No static resource v1/paymnts.")), Refusal::NoSuchRoute);
        assert_eq!(refusal(400, &problem("Invalid request content.")), Refusal::Malformed);
        assert_eq!(refusal(418, &problem("")), Refusal::Unrecognised);
    }

    #[test]
    fn the_report_is_balanced_only_when_every_part_says_so() {
        let r = |b: Option<bool>, net: i64, d: &[&str]| WireReport {
            balanced: b,
            ledger_net: net,
            drifted_accounts: d.iter().map(|s| s.to_string()).collect(),
        };
        assert!(r(None, 0, &[]).balanced());
        assert!(r(Some(true), 0, &[]).balanced());
        assert!(!r(Some(false), 0, &[]).balanced());
        assert!(!r(Some(true), 5, &[]).balanced());
        assert!(!r(None, 0, &["x"]).balanced());
    }
}
