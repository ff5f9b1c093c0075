//! Read-only operations. Reads are scoped to the principal's accounts: what it may not touch, it
//! may not see (a foreign payment is NOT_FOUND, not "forbidden", so ids cannot be probed).

use schemars::JsonSchema;
use serde::Deserialize;

use super::{Caller, Decision, Gateway, decode_cursor, map_backend_error};
use crate::backend::{Balance, IntegrityReport, LedgerEntry, Page, Payment, PaymentQuery, PaymentStatus};
use crate::catalogue::scopes;
use crate::error::{AgentError, ErrorCode};
use crate::ids::AccountId;
use crate::policy;

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPaymentsArgs {
    /// Only payments touching this account (must be one of yours). Omit for all your accounts.
    #[serde(default)]
    pub account_id: Option<String>,
    /// pending | succeeded | failed
    #[serde(default)]
    pub status: Option<String>,
    /// Page size, 1-100 (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccountLedgerArgs {
    /// The account whose postings to list (must be one of yours).
    pub account_id: String,
    /// Page size, 1-100 (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

impl Gateway {
    async fn check_account(&self, caller: &Caller, tool: &str, account: &str) -> Result<AccountId, AgentError> {
        let p = &caller.principal;
        let checked = AccountId::parse(account)
            .map_err(AgentError::from)
            .and_then(|a| policy::check_read(|s| p.has_scope(s), &p.profile, &a).map(|_| a));
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
            Err(e) => Err(map_backend_error(&e)),
        }
    }

    pub async fn list_payments(&self, caller: &Caller, args: ListPaymentsArgs) -> Result<Page<Payment>, AgentError> {
        let accounts = match &args.account_id {
            Some(a) => vec![self.check_account(caller, "list_payments", a).await?],
            None => caller.principal.profile.allowed_accounts.clone(),
        };
        let status = match args.status.as_deref() {
            None => None,
            Some(s) => Some(
                PaymentStatus::parse(s)
                    .ok_or_else(|| AgentError::invalid("status must be one of pending, succeeded, failed"))?,
            ),
        };
        let query = PaymentQuery {
            accounts,
            status,
            before_seq: decode_cursor(args.cursor.as_deref())?,
            limit: self.page_limit(args.limit)?,
            from: None,
            to: None,
        };
        self.backend.list_payments(query).await.map_err(|e| map_backend_error(&e))
    }

    pub async fn get_account_ledger(
        &self,
        caller: &Caller,
        args: AccountLedgerArgs,
    ) -> Result<Page<LedgerEntry>, AgentError> {
        let account = self.check_account(caller, "get_account_ledger", &args.account_id).await?;
        let before = decode_cursor(args.cursor.as_deref())?;
        let limit = self.page_limit(args.limit)?;
        self.backend.account_entries(&account, before, limit).await.map_err(|e| map_backend_error(&e))
    }

    pub async fn check_ledger_integrity(&self, caller: &Caller) -> Result<IntegrityReport, AgentError> {
        if !caller.principal.has_scope(scopes::ADMIN) {
            return Err(AgentError::new(ErrorCode::InsufficientScope, "check_ledger_integrity needs payments:admin"));
        }
        let report = self.backend.check_integrity().await.map_err(|e| map_backend_error(&e))?;
        let mut d =
            Decision::new("check_ledger_integrity", if report.ok { "integrity_ok" } else { "integrity_failed" });
        d.detail = (!report.ok).then(|| report.problems.join("; "));
        self.audit(caller, d).await;
        Ok(report)
    }
}
