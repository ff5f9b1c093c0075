//! Read-only operations. Reads are scoped to the principal: its profile's accounts and, for an agent
//! acting for someone, that person's payments alone (`AgentPrincipal::sees`). What it may not see
//! does not exist for it (a foreign payment is NOT_FOUND, not "forbidden", so ids cannot be probed).
//!
//! Payments live in two places: the backend holds the ledger's payments, and the gateway's rail
//! records hold the collections (M-Pesa) that no ledger holds. `list_payments` merges both, newest
//! first, under one opaque cursor that keeps its place in each.

use super::windows::{parse_window, today_window};
use super::{Caller, Decision, Gateway, decode_cursor};
use crate::catalogue::scopes;
use crate::clock::UnixSecs;
use crate::domain::ids::AccountId;
use crate::domain::payment::{
    Balance, EntryQuery, IntegrityReport, LedgerEntry, Page, Payment, PaymentQuery, PaymentStatus,
};
use crate::domain::policy;
use crate::error::{AgentError, ErrorCode};

/// Attempts at a first page whose backend listing moved between its two reads (a payment posted
/// meanwhile); the last attempt keeps what it read.
const LIST_ATTEMPTS_MAX: u32 = 3;

/// Which page a listing asks for: its size (1-100, default 20) and the `next_cursor` of the
/// previous page.
#[derive(Debug, Clone, Copy, Default)]
pub struct PageAsk<'a> {
    pub limit: Option<u32>,
    pub cursor: Option<&'a str>,
}

/// A time window as the caller wrote it (RFC 3339 or a date; checked by `windows.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WindowAsk<'a> {
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
}

/// One page of payments; `next_cursor` is opaque (`ListCursor`).
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentPage {
    pub items: Vec<Payment>,
    pub next_cursor: Option<String>,
}

/// Where a listing stands in one of its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    /// Nothing listed yet.
    Start,
    /// Next: rows before this sequence number (the source's own).
    Before(i64),
    /// Nothing left.
    Done,
}

impl Pos {
    fn before(self) -> Option<i64> {
        match self {
            Pos::Before(seq) => Some(seq),
            Pos::Start | Pos::Done => None,
        }
    }
    fn encode(self) -> String {
        match self {
            Pos::Start => "s".into(),
            Pos::Before(seq) => seq.to_string(),
            Pos::Done => "d".into(),
        }
    }
    fn parse(s: &str) -> Option<Pos> {
        match s {
            "s" => Some(Pos::Start),
            "d" => Some(Pos::Done),
            n => n.parse::<i64>().ok().filter(|n| *n > 0).map(Pos::Before),
        }
    }
}

/// `list_payments`' cursor: its place in the backend's payments and in the gateway's rail records.
/// Opaque to agents: base64url of `v2:<backend>:<rails>`. A `v1:<seq>` cursor, issued before rail
/// records were listed, still continues the walk it began: the backend's payments only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ListCursor {
    backend: Pos,
    rails: Pos,
}

impl ListCursor {
    const START: ListCursor = ListCursor { backend: Pos::Start, rails: Pos::Start };

    fn encode(self) -> Option<String> {
        use base64::Engine;
        if self.backend == Pos::Done && self.rails == Pos::Done {
            return None;
        }
        let text = format!("v2:{}:{}", self.backend.encode(), self.rails.encode());
        Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text))
    }

    fn decode(cursor: Option<&str>) -> Result<ListCursor, AgentError> {
        use base64::Engine;
        let Some(c) = cursor else { return Ok(ListCursor::START) };
        if let Ok(Some(seq)) = decode_cursor(Some(c)) {
            return Ok(ListCursor { backend: Pos::Before(seq), rails: Pos::Done });
        }
        let bad = || AgentError::invalid("cursor is not one this server issued; pass next_cursor back unchanged");
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
        let text = String::from_utf8(raw).map_err(|_| bad())?;
        let (backend, rails) = text.strip_prefix("v2:").and_then(|t| t.split_once(':')).ok_or_else(bad)?;
        Ok(ListCursor { backend: Pos::parse(backend).ok_or_else(bad)?, rails: Pos::parse(rails).ok_or_else(bad)? })
    }
}

/// A listing's filters, parsed.
struct Listing {
    accounts: Vec<AccountId>,
    status: Option<PaymentStatus>,
    from: Option<UnixSecs>,
    to: Option<UnixSecs>,
}

fn parse_status(status: Option<&str>) -> Result<Option<PaymentStatus>, AgentError> {
    status
        .map(|s| {
            PaymentStatus::parse(s)
                .ok_or_else(|| AgentError::invalid("status must be one of pending, succeeded, failed"))
        })
        .transpose()
}

impl Gateway {
    async fn check_account(&self, caller: &Caller, tool: &str, account: &str) -> Result<AccountId, AgentError> {
        let p = &caller.principal;
        let checked = AccountId::parse(account)
            .map_err(AgentError::from)
            .and_then(|a| policy::check_read(|s| p.has_scope(s), &p.profile, &a).map(|_| a).map_err(AgentError::from));
        match checked {
            Ok(a) => Ok(a),
            Err(e) => {
                let mut d = Decision::new(tool, "denied");
                d.code = Some(e.code);
                d.detail = Some(e.message.clone());
                self.audit(caller, d).await;
                Err(e)
            }
        }
    }

    pub async fn get_balance(&self, caller: &Caller, account_id: &str) -> Result<Balance, AgentError> {
        let account = self.check_account(caller, "get_balance", account_id).await?;
        match self.backend.balance(&account).await {
            Ok(Some(b)) => Ok(b),
            Ok(None) => Err(AgentError::new(ErrorCode::NotFound, format!("account {account} does not exist"))),
            Err(e) => Err(AgentError::from(&e)),
        }
    }

    /// `list_payments`: one of the caller's accounts (or all of them), a status, a window.
    pub async fn list_payments(
        &self,
        caller: &Caller,
        account_id: Option<&str>,
        status: Option<&str>,
        window: WindowAsk<'_>,
        page: PageAsk<'_>,
    ) -> Result<PaymentPage, AgentError> {
        let accounts = match account_id {
            Some(a) => vec![self.check_account(caller, "list_payments", a).await?],
            None => caller.principal.profile.allowed_accounts.clone(),
        };
        let status = parse_status(status)?;
        let (from, to) = parse_window(window.from, window.to)?;
        self.list(caller, Listing { accounts, status, from, to }, page).await
    }

    /// `get_today_transactions`: `list_payments` over today (UTC).
    pub async fn today_transactions(
        &self,
        caller: &Caller,
        status: Option<&str>,
        page: PageAsk<'_>,
    ) -> Result<PaymentPage, AgentError> {
        let status = parse_status(status)?;
        let (from, to) = today_window(self.clock.now(), None, None)?;
        let listing = Listing {
            accounts: caller.principal.profile.allowed_accounts.clone(),
            status,
            from: Some(from),
            to: Some(to),
        };
        self.list(caller, listing, page).await
    }

    /// `get_failed_transactions`: failed payments over a window (default: today, UTC).
    pub async fn failed_transactions(
        &self,
        caller: &Caller,
        window: WindowAsk<'_>,
        page: PageAsk<'_>,
    ) -> Result<PaymentPage, AgentError> {
        let (from, to) = today_window(self.clock.now(), window.from, window.to)?;
        let listing = Listing {
            accounts: caller.principal.profile.allowed_accounts.clone(),
            status: Some(PaymentStatus::Failed),
            from: Some(from),
            to: Some(to),
        };
        self.list(caller, listing, page).await
    }

    async fn list(&self, caller: &Caller, listing: Listing, page: PageAsk<'_>) -> Result<PaymentPage, AgentError> {
        let (limit, at) = (page.limit, ListCursor::decode(page.cursor)?);
        let query = PaymentQuery {
            accounts: listing.accounts,
            status: listing.status,
            before_seq: None,
            limit: self.page_limit(limit)?,
            from: listing.from,
            to: listing.to,
            // An agent acting for someone lists that person's payments alone; one on its own token,
            // the payments made for no one.
            principal_user: Some(caller.principal.user.clone().unwrap_or_default()),
        };
        let mut attempt = 1;
        loop {
            if let Some(page) = self.list_page(caller, &query, at, attempt >= LIST_ATTEMPTS_MAX).await? {
                return Ok(page);
            }
            attempt += 1;
        }
    }

    /// One page merged from the backend's payments and the gateway's rail records (the
    /// collections no ledger holds; an external ledger's own records are left to that ledger),
    /// newest first. `None` when the backend's first page moved between its two reads and
    /// `last_attempt` is false.
    async fn list_page(
        &self,
        caller: &Caller,
        q: &PaymentQuery,
        at: ListCursor,
        last_attempt: bool,
    ) -> Result<Option<PaymentPage>, AgentError> {
        let backend = match at.backend {
            Pos::Done => Page { items: vec![], next_cursor: None },
            pos => self
                .backend
                .list_payments(PaymentQuery { before_seq: pos.before(), ..q.clone() })
                .await
                .map_err(|e| AgentError::from(&e))?,
        };
        let rails = match at.rails {
            Pos::Done => vec![],
            pos => {
                // One more than a page: whether another follows.
                let rq = PaymentQuery { before_seq: pos.before(), limit: q.limit + 1, ..q.clone() };
                self.store.rail_payments(rq, self.backend.name()).await.map_err(|error| {
                    tracing::error!(correlation_id = %caller.correlation_id, %error, "rail records read failed");
                    AgentError::internal()
                })?
            }
        };
        // Newest first by creation time (then id) across both sources; each source stays in its own order.
        let (mut from_backend, mut from_rails) = (0usize, 0usize);
        let mut items = Vec::with_capacity(q.limit as usize);
        let mut b = backend.items.iter().peekable();
        let mut r = rails.iter().peekable();
        while items.len() < q.limit as usize {
            let backend_next = match (b.peek(), r.peek()) {
                (Some(p), Some((_, rec))) => (p.created_at, p.id.as_str()) >= (rec.created_at, rec.id.as_str()),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if backend_next {
                items.extend(b.next().cloned());
                from_backend += 1;
            } else {
                items.extend(r.next().map(|(_, rec)| rec.payment()));
                from_rails += 1;
            }
        }
        let backend_next = if from_backend == backend.items.len() {
            backend.next_cursor.map_or(Pos::Done, Pos::Before)
        } else if from_backend == 0 {
            at.backend
        } else {
            // The backend's cursor after the last payment taken is the next cursor of a page
            // exactly that long, read again from the same place.
            let again = PaymentQuery { before_seq: at.backend.before(), limit: from_backend as u32, ..q.clone() };
            let again = self.backend.list_payments(again).await.map_err(|e| AgentError::from(&e))?;
            let same = again.items.iter().map(|p| &p.id).eq(backend.items.iter().take(from_backend).map(|p| &p.id));
            match (again.next_cursor, same || last_attempt) {
                (Some(seq), true) => Pos::Before(seq),
                // Payments posted between the two reads of a first page: read the page again.
                _ if !last_attempt => return Ok(None),
                // (Never expected: the backend lost payments it just listed.) Repeat rather than skip.
                _ => at.backend,
            }
        };
        let rails_next = if from_rails == rails.len() {
            Pos::Done
        } else if let Some((seq, _)) = from_rails.checked_sub(1).and_then(|i| rails.get(i)) {
            Pos::Before(*seq)
        } else {
            // None taken from a walk's start: pin it there, so records opened later are not
            // listed among older payments on later pages.
            match (at.rails, rails.first()) {
                (Pos::Start, Some((seq, _))) => Pos::Before(seq + 1),
                (pos, _) => pos,
            }
        };
        let next = ListCursor { backend: backend_next, rails: rails_next };
        // Filtered in the query; again here for a backend that ignores the filter (an external
        // ledger): the cursors above keep their places whatever this leaves out.
        items.retain(|p| caller.principal.sees(p));
        Ok(Some(PaymentPage { items, next_cursor: next.encode() }))
    }

    pub async fn get_account_ledger(
        &self,
        caller: &Caller,
        account_id: &str,
        page: PageAsk<'_>,
    ) -> Result<Page<LedgerEntry>, AgentError> {
        let account = self.check_account(caller, "get_account_ledger", account_id).await?;
        let q = EntryQuery { account, before_seq: decode_cursor(page.cursor)?, limit: self.page_limit(page.limit)? };
        self.backend.account_entries(q).await.map_err(|e| AgentError::from(&e))
    }

    /// The scheduler's incremental check (no caller): a clean result moves the checkpoint forward.
    pub async fn scheduled_integrity(&self, full: bool) -> Result<IntegrityReport, crate::domain::error::BackendError> {
        self.backend.check_integrity(full).await
    }

    /// `paygate check-ledger`: the same check from the operator's shell, where no request timeout
    /// cuts off a full scan of a large ledger; audited like the tool, as the host's "cli".
    pub async fn cli_integrity(&self, full: bool) -> Result<IntegrityReport, crate::domain::error::BackendError> {
        let report = self.backend.check_integrity(full).await?;
        let mut d =
            Decision::new("check_ledger_integrity", if report.ok { "integrity_ok" } else { "integrity_failed" });
        d.detail = (!report.ok).then(|| report.problems.join("; "));
        self.audit_as(super::rails::GATEWAY_ISSUER, "cli", "-", d).await;
        Ok(report)
    }

    pub async fn check_ledger_integrity(&self, caller: &Caller, full: bool) -> Result<IntegrityReport, AgentError> {
        if !caller.principal.has_scope(scopes::INTEGRITY) {
            return Err(AgentError::new(
                ErrorCode::InsufficientScope,
                "check_ledger_integrity needs payments:integrity",
            ));
        }
        let report = self.backend.check_integrity(full).await.map_err(|e| AgentError::from(&e))?;
        let mut d =
            Decision::new("check_ledger_integrity", if report.ok { "integrity_ok" } else { "integrity_failed" });
        d.detail = (!report.ok).then(|| report.problems.join("; "));
        self.audit(caller, d).await;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_cursors_round_trip_keep_old_cursors_working_and_reject_forgeries() {
        for c in [
            ListCursor { backend: Pos::Before(7), rails: Pos::Start },
            ListCursor { backend: Pos::Done, rails: Pos::Before(3) },
            ListCursor { backend: Pos::Start, rails: Pos::Done },
        ] {
            assert_eq!(ListCursor::decode(c.encode().as_deref()).unwrap(), c);
        }
        assert_eq!(ListCursor { backend: Pos::Done, rails: Pos::Done }.encode(), None, "the last page has no cursor");
        assert_eq!(ListCursor::decode(None).unwrap(), ListCursor::START);
        // A cursor issued before rail records were listed continues the backend's payments.
        let v1 = super::super::encode_cursor(42);
        assert_eq!(ListCursor::decode(Some(&v1)).unwrap(), ListCursor { backend: Pos::Before(42), rails: Pos::Done });
        use base64::Engine;
        for bad in ["v2:1", "v2:0:s", "v2:x:s", "v2:-1:d", "v3:s:s"] {
            let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bad);
            assert!(ListCursor::decode(Some(&forged)).is_err(), "{bad}");
        }
        assert!(ListCursor::decode(Some("!!")).is_err());
    }
}
