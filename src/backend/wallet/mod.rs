//! `WalletService`: a `PaymentBackend` over the payments wallet service (an immutable double-entry
//! ledger with idempotency, a hold → provider → settle/reverse saga and an outbox), behind the same
//! seam and the same gateway-side record (`journal::Journaled`) as the HTTP ledger.
//!
//! What differs from the HTTP ledger, and how it is bridged:
//! - **Accounts** are the service's UUIDs: `backend.wallet_accounts` maps each paygate account id
//!   to one (parsed at load). An account with no mapping is `AccountNotFound`, and nothing is sent.
//! - **Payment ids** are the service's to choose. The gateway keeps its own id; the service's UUID
//!   is the record's `rail_ref` (as `pay_<32 hex>`, its inverse exact), and reads go through the
//!   record (`PaymentBackend::names_its_payments`).
//! - **The idempotency key** is the gateway's (derived from issuer, principal, tool and
//!   operation_id with the shared secret: the same on every retry and every replica), sent as
//!   `Idempotency-Key` under one configured `merchantId` (the service scopes keys by merchant).
//! - **Answers before the end.** The saga may answer `PROCESSING` (or `CREATED`, `FUNDS_LOCKED`,
//!   `AUTHORIZED`): that is `pending`, and the poll job settles it from `GET /v1/payments/{id}`.
//! - **Refusals** are RFC 7807 problems, mapped in `wire::refusal` with no catch-all success: 409
//!   (the key is in progress there) is `OutcomeUnknown` (the key stays in flight; a retry asks
//!   again with the same key), and a 422 whose detail is none of the three the service writes is
//!   `OutcomeUnknown` too.
//! - **A 5xx is never sent again under the same key**: the service releases its key when its saga
//!   throws, even after the hold committed (`http::Transport::retry_server_errors` off, and
//!   `resend_safe` keeps the journal from re-sending it on the agent's retry).
//!
//! The transport is the HTTP ledger's (`HttpLedger::transport`): same key and bytes on every retry,
//! the breaker, `backend.tls_*` (private CA, client certificate), no redirects.

pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};

use super::http::{Exchange, HttpLedger, HttpLedgerConfig, Transport};
use super::{
    BackendError, Balance, EntryQuery, IntegrityReport, LedgerEntry, Page, Payment, PaymentBackend, PaymentKind,
    PaymentQuery, PaymentStatus, RefundRequest, TransferRequest,
};
use crate::clock::Clock;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::{Currency, format_minor};
use wire::{Problem, Refusal, WalletStatus, WalletUuid};

pub use wire::WalletUuid as WalletAccount;

/// The `rail` column of the records the journal keeps of this backend's payments.
pub const NAME: &str = "wallet-service";
/// Longest `merchantId` accepted (the service keeps it as text; a bound keeps headers and logs sane).
pub const MERCHANT_ID_CHARS_MAX: usize = 128;
/// Most accounts `backend.wallet_accounts` may map.
pub const ACCOUNTS_MAX: usize = 10_000;
/// Most ledger lines asked for in one page (`GET /v1/accounts/{id}/ledger?limit=`).
pub const LEDGER_LIMIT_MAX: u32 = 1_000;

pub struct WalletConfig {
    pub transport: HttpLedgerConfig,
    pub merchant_id: String,
    pub accounts: BTreeMap<AccountId, WalletAccount>,
}

pub struct WalletService {
    http: Arc<HttpLedger>,
    merchant_id: String,
    accounts: BTreeMap<AccountId, WalletAccount>,
    by_uuid: BTreeMap<WalletAccount, AccountId>,
    clock: Arc<dyn Clock>,
}

/// The gateway's reference for a payment or refund the service named: `pay_<32 hex>`.
pub fn reference(uuid: &WalletUuid) -> Result<PaymentId, BackendError> {
    PaymentId::parse(&format!("pay_{}", uuid.hex()))
        .map_err(|_| BackendError::OutcomeUnknown("the wallet service named a payment by no UUID".into()))
}

/// The service's UUID behind a reference made by [`reference`].
pub fn uuid_of(id: &PaymentId) -> Option<WalletUuid> {
    id.as_str().strip_prefix("pay_").and_then(WalletUuid::from_hex)
}

impl WalletService {
    pub fn new(cfg: WalletConfig, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        let invalid = |what: &str| BackendError::Unavailable(format!("invalid wallet service configuration: {what}"));
        let m = cfg.merchant_id.trim();
        if m.is_empty() || m.chars().count() > MERCHANT_ID_CHARS_MAX || m.chars().any(char::is_control) {
            return Err(invalid(&format!("merchant_id must be 1-{MERCHANT_ID_CHARS_MAX} printable characters")));
        }
        if cfg.accounts.is_empty() || cfg.accounts.len() > ACCOUNTS_MAX {
            return Err(invalid(&format!("wallet_accounts must map 1-{ACCOUNTS_MAX} accounts")));
        }
        let mut by_uuid = BTreeMap::new();
        for (id, uuid) in &cfg.accounts {
            if by_uuid.insert(uuid.clone(), id.clone()).is_some() {
                return Err(invalid(&format!("two accounts map to {}", uuid.as_str())));
            }
        }
        // A 500 is never retried: the service releases its key when its saga throws, even after
        // the hold committed, so a same-key retry could hold the payer's money twice.
        let t = Transport { name: "wallet service", credential_required: false, retry_server_errors: false };
        let http = Arc::new(HttpLedger::transport(cfg.transport, clock.clone(), t)?);
        Ok(WalletService { http, merchant_id: m.to_string(), accounts: cfg.accounts, by_uuid, clock })
    }

    /// The mapping, for `paygate doctor`.
    pub fn accounts(&self) -> &BTreeMap<AccountId, WalletAccount> {
        &self.accounts
    }

    /// The transport, for its breaker's gauge (the same one the HTTP ledger's shows).
    pub fn transport(&self) -> Arc<HttpLedger> {
        self.http.clone()
    }

    fn uuid(&self, account: &AccountId) -> Result<&WalletUuid, BackendError> {
        self.accounts.get(account).ok_or_else(|| BackendError::AccountNotFound(account.clone()))
    }

    /// A payment with the service's status, the request's parties and the given reference.
    fn payment(&self, id: PaymentId, kind: PaymentKind, status: PaymentStatus, money: (i64, Currency)) -> Payment {
        Payment {
            id,
            kind,
            status,
            // The service's view names no accounts: the journal answers with its own record's
            // parties (`Journaled` rebuilds the payment from it); these are never shown alone.
            from_account: placeholder(),
            to_account: placeholder(),
            amount_minor: money.0,
            currency: money.1,
            refunded_minor: 0,
            refund_of: None,
            memo: None,
            principal_sub: String::new(),
            principal_user: None,
            created_at: self.clock.now(),
        }
    }

    /// A money-moving POST: `Ok((status, body))` only for a 200/201; every refusal mapped.
    async fn post_money(
        &self,
        op: &'static str,
        url: reqwest::Url,
        key: &str,
        body: serde_json::Value,
        (currency, payment): (Currency, Option<&PaymentId>),
    ) -> Result<Vec<u8>, BackendError> {
        let bytes = serde_json::to_vec(&body).map_err(|e| BackendError::Unavailable(format!("encoding: {e}")))?;
        let (status, body, earlier_maybe_applied) =
            match self.http.exchange(op, Method::POST, url, Some((key, None)), Some(bytes)).await? {
                Exchange::Failed { maybe_applied: true, detail } => return Err(unknown(op, detail)),
                Exchange::Failed { maybe_applied: false, detail } => return Err(BackendError::Unavailable(detail)),
                Exchange::Answered { status, body, earlier_maybe_applied } => (status, body, earlier_maybe_applied),
            };
        if status == StatusCode::OK || status == StatusCode::CREATED {
            return Ok(body);
        }
        let problem = Problem::parse(&body);
        let refusal = wire::refusal(status.as_u16(), &problem);
        // The service's words go to the log, never to the agent (they could carry instructions).
        tracing::warn!(wallet.op = op, http.status = status.as_u16(), detail = %problem.detail, "wallet service refusal");
        // Definitive whatever happened before: this key belongs to another body.
        if refusal == Refusal::KeyReused {
            return Err(BackendError::IdempotencyKeyReused);
        }
        if earlier_maybe_applied {
            return Err(unknown(
                op,
                format!("an earlier attempt may have been applied; the retry was answered {status}"),
            ));
        }
        let minor = |m: Option<i64>| m.map_or_else(|| "(not shown)".to_string(), |m| format_minor(m, currency));
        Err(match refusal {
            Refusal::InsufficientFunds { account, balance, needed } => BackendError::InsufficientFunds {
                // The service names the account it debits: the payer (the only one a payment debits).
                account: account
                    .and_then(|a| self.by_uuid.get(&a).cloned())
                    .unwrap_or_else(placeholder),
                balance: minor(balance),
                needed: minor(needed),
            },
            Refusal::KeyReused => BackendError::IdempotencyKeyReused,
            Refusal::InProgress => unknown(
                op,
                "the wallet service is still processing this Idempotency-Key; a retry with the same operation_id asks again"
                    .into(),
            ),
            Refusal::NotRefundable => match payment {
                Some(p) => BackendError::NotRefundable(p.clone()),
                None => unknown(op, "a refusal about a payment this request does not name".into()),
            },
            Refusal::RefundExceedsRemaining { requested, remaining } => {
                BackendError::RefundExceedsRemaining { requested: minor(requested), remaining: minor(remaining) }
            }
            Refusal::PaymentNotFound => match payment {
                Some(p) => BackendError::PaymentNotFound(p.clone()),
                None => BackendError::Unavailable("wallet service answered 404 for a new payment".into()),
            },
            Refusal::NoSuchRoute => {
                tracing::error!(wallet.op = op, "wallet service has no such route: check backend.http_url");
                BackendError::Unavailable("wallet service answered 404 for the route".into())
            }
            Refusal::Malformed => {
                tracing::error!(wallet.op = op, "wallet service refused the request as malformed");
                BackendError::Unavailable(format!("wallet service refused the request: {status}"))
            }
            Refusal::Unrecognised => {
                tracing::error!(wallet.op = op, http.status = status.as_u16(), "wallet service refusal outside its contract");
                unknown(op, format!("{status} with a refusal this gateway does not know"))
            }
        })
    }

    /// A read: `Ok(None)` for a 404; any other failure is `Unavailable`.
    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        op: &'static str,
        url: reqwest::Url,
    ) -> Result<Option<T>, BackendError> {
        let (status, body) = match self.http.exchange(op, Method::GET, url, None, None).await? {
            Exchange::Failed { detail, .. } => return Err(BackendError::Unavailable(detail)),
            Exchange::Answered { status, body, .. } => (status, body),
        };
        if status == StatusCode::OK {
            return serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| BackendError::Unavailable(format!("wallet service answered an unreadable {op}: {e}")));
        }
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        tracing::error!(wallet.op = op, http.status = status.as_u16(), "unexpected wallet service answer");
        Err(BackendError::Unavailable(format!("wallet service answered {status}")))
    }
}

/// The account a wallet answer cannot name (see [`WalletService::payment`]).
fn placeholder() -> AccountId {
    AccountId::parse(NAME).unwrap_or_else(|_| unreachable!("a valid account id"))
}

fn unknown(op: &str, detail: String) -> BackendError {
    BackendError::OutcomeUnknown(format!("{op}: {detail}"))
}

fn currency_of(op: &str, c: &str) -> Result<Currency, BackendError> {
    Currency::parse(c).map_err(|_| BackendError::Unavailable(format!("wallet service answered {op} in {c:?}")))
}

#[async_trait]
impl PaymentBackend for WalletService {
    fn name(&self) -> &'static str {
        NAME
    }

    fn names_its_payments(&self) -> bool {
        true
    }

    /// Not after the service answered a 5xx: its `PaymentService` releases the key when the saga
    /// throws, even once the hold committed, so the same key would make a second payment.
    fn resend_safe(&self, reason: Option<&str>) -> bool {
        reason.is_none_or(|r| !r.contains(super::http::SERVER_FAILED))
    }

    async fn transfer(&self, req: TransferRequest) -> Result<Payment, BackendError> {
        let (payer, payee) = (self.uuid(&req.from_account)?, self.uuid(&req.to_account)?);
        let url = self.http.url(&["v1", "payments"], &[])?;
        let body = serde_json::json!({
            "merchantId": self.merchant_id,
            "payerAccountId": payer.as_str(),
            "payeeAccountId": payee.as_str(),
            "amount": req.amount.minor(),
            "currency": req.amount.currency(),
        });
        let currency = req.amount.currency();
        let answer = self.post_money("transfer", url, &req.attempt.key, body, (currency, None)).await?;
        let p: wire::WirePayment =
            serde_json::from_slice(&answer).map_err(|e| unknown("transfer", format!("an unreadable payment: {e}")))?;
        if p.amount != req.amount.minor() || p.currency != currency.code() {
            tracing::error!(wallet.payment = %p.id.as_str(), "wallet service answered a payment that does not match the request");
            return Err(unknown("transfer", "a payment that does not match the request".into()));
        }
        let status = WalletStatus::parse(&p.status);
        if status == WalletStatus::Unrecognised {
            tracing::warn!(wallet.payment = %p.id.as_str(), status = %p.status, "wallet service status unknown here: pending");
        }
        Ok(self.payment(reference(&p.id)?, PaymentKind::Payment, status.payment_status(), (p.amount, currency)))
    }

    async fn refund(&self, req: RefundRequest) -> Result<Payment, BackendError> {
        // The journal sends the service's own reference of the payment, and a fixed amount.
        let original = uuid_of(&req.payment_id).ok_or_else(|| BackendError::PaymentNotFound(req.payment_id.clone()))?;
        let Some(amount) = req.amount_minor else {
            return Err(BackendError::Unavailable("a wallet service refund needs its amount".into()));
        };
        let url = self.http.url(&["v1", "payments", original.as_str(), "refunds"], &[])?;
        let body = serde_json::json!({ "amount": amount });
        // Amounts in refusals are shown in the payment's currency, which the service knows: ask it.
        let currency = match self.get_json::<wire::WirePayment>("payment", self.payment_url(&original)?).await? {
            Some(p) => currency_of("payment", &p.currency)?,
            None => return Err(BackendError::PaymentNotFound(req.payment_id.clone())),
        };
        let answer = self.post_money("refund", url, &req.attempt.key, body, (currency, Some(&req.payment_id))).await?;
        let r: wire::WireRefund =
            serde_json::from_slice(&answer).map_err(|e| unknown("refund", format!("an unreadable refund: {e}")))?;
        if r.payment_id != original || r.amount != amount {
            return Err(unknown("refund", "a refund that does not match the request".into()));
        }
        let status = match r.status.as_str() {
            "SUCCEEDED" => PaymentStatus::Succeeded,
            "FAILED" => PaymentStatus::Failed,
            _ => PaymentStatus::Pending,
        };
        let mut p = self.payment(reference(&r.id)?, PaymentKind::Refund, status, (amount, currency));
        p.refund_of = Some(req.payment_id.clone());
        Ok(p)
    }

    /// By the service's reference (`pay_<hex>`); the journal asks with the record's `rail_ref`.
    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, BackendError> {
        let Some(uuid) = uuid_of(id) else { return Ok(None) };
        let Some(p) = self.get_json::<wire::WirePayment>("payment", self.payment_url(&uuid)?).await? else {
            return Ok(None);
        };
        if p.id != uuid {
            return Err(BackendError::Unavailable("wallet service answered another payment".into()));
        }
        let currency = currency_of("payment", &p.currency)?;
        let status = WalletStatus::parse(&p.status).payment_status();
        Ok(Some(self.payment(id.clone(), PaymentKind::Payment, status, (p.amount, currency))))
    }

    async fn balance(&self, account: &AccountId) -> Result<Option<Balance>, BackendError> {
        let Some(uuid) = self.accounts.get(account) else { return Ok(None) };
        let url = self.http.url(&["v1", "accounts", uuid.as_str(), "balance"], &[])?;
        let Some(b) = self.get_json::<wire::WireBalance>("balance", url).await? else { return Ok(None) };
        if &b.account_id != uuid {
            return Err(BackendError::Unavailable("wallet service answered another account's balance".into()));
        }
        Ok(Some(Balance {
            account_id: account.clone(),
            currency: currency_of("balance", &b.currency)?,
            balance_minor: b.balance,
        }))
    }

    /// The service lists no payments: the journal lists the gateway's own records instead.
    async fn list_payments(&self, _query: PaymentQuery) -> Result<Page<Payment>, BackendError> {
        Ok(Page { items: vec![], next_cursor: None })
    }

    /// Newest first, with running balances worked back from today's balance; one page (the
    /// service pages by nothing but a limit).
    async fn account_entries(&self, q: EntryQuery) -> Result<Page<LedgerEntry>, BackendError> {
        if q.before_seq.is_some() {
            return Ok(Page { items: vec![], next_cursor: None });
        }
        let Some(balance) = self.balance(&q.account).await? else {
            return Err(BackendError::AccountNotFound(q.account.clone()));
        };
        let uuid = self.uuid(&q.account)?;
        let limit = q.limit.clamp(1, LEDGER_LIMIT_MAX).to_string();
        let url = self.http.url(&["v1", "accounts", uuid.as_str(), "ledger"], &[("limit", limit)])?;
        let lines: Vec<wire::WireEntry> = self.get_json("ledger", url).await?.unwrap_or_default();
        let mut after = balance.balance_minor;
        let mut items = Vec::with_capacity(lines.len());
        for l in lines {
            let signed = match l.direction.as_str() {
                "CREDIT" => l.amount,
                "DEBIT" => -l.amount,
                other => return Err(BackendError::Unavailable(format!("wallet service ledger direction {other:?}"))),
            };
            let created_at = l
                .created_at
                .as_deref()
                .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
                .map_or(0, |t| t.unix_timestamp());
            items.push(LedgerEntry {
                seq: l.id,
                payment_id: l.transaction_id.as_ref().map(reference).transpose()?,
                amount_minor: signed,
                currency: balance.currency,
                balance_after_minor: after,
                description: "wallet service posting".into(),
                created_at,
            });
            after -= signed;
        }
        Ok(Page { items, next_cursor: None })
    }

    /// The service's reconciliation report: the sum of every posting, and the accounts whose
    /// balance drifted from their postings. It checks everything each time (`full` or not).
    async fn check_integrity(&self, _full: bool) -> Result<IntegrityReport, BackendError> {
        let url = self.http.url(&["v1", "reconciliation", "report"], &[])?;
        let report: wire::WireReport = self
            .get_json("reconciliation", url)
            .await?
            .ok_or_else(|| BackendError::Unavailable("wallet service has no reconciliation report".into()))?;
        let mut problems: Vec<String> =
            report.drifted_accounts.iter().map(|a| format!("account {a}: balance drifted from its postings")).collect();
        if report.ledger_net != 0 {
            problems.push(format!("postings sum to {}, not 0", report.ledger_net));
        }
        if report.balanced == Some(false) && problems.is_empty() {
            problems.push("the wallet service reports its ledger unbalanced".into());
        }
        Ok(IntegrityReport {
            ok: report.balanced(),
            accounts_checked: self.accounts.len() as i64,
            postings_checked: 0,
            currency_sums: vec![("*".into(), report.ledger_net)],
            problems,
            mode: "full".into(),
            since: None,
        })
    }
}

impl WalletService {
    fn payment_url(&self, uuid: &WalletUuid) -> Result<reqwest::Url, BackendError> {
        self.http.url(&["v1", "payments", uuid.as_str()], &[])
    }
}
