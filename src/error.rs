//! The agent error taxonomy: what a model sees when a tool call is refused or fails.
//!
//! Every refusal is a tool *result* with `isError: true` and `{"error": {...}}` structured content.
//! `suggested_action` is always the gateway's own text, never copied from backend or user data, so
//! injected text cannot ride along in an error.

use serde::{Deserialize, Serialize};

use crate::domain::error::BackendError;
use crate::domain::policy::Refusal;
use crate::mandate::MandateError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidArgument,
    InsufficientScope,
    AccountNotAllowed,
    ApprovalRequired,
    ApprovalRejected,
    MandateInvalid,
    MandateExpired,
    MandateMismatch,
    IdempotencyConflict,
    OperationInProgress,
    InsufficientFunds,
    NotFound,
    RateLimited,
    BudgetExceeded,
    PrincipalSuspended,
    BackendUnavailable,
    OutcomeUnknown,
    Internal,
    // Operators' refusals (the operator API and /approvals; no agent tool answers these).
    /// No valid credential for the operator resource.
    Unauthorized,
    /// Nobody reviews, pre-authorizes or suspends on their own behalf.
    SelfReview,
    /// A user confirming an approval past the user's tier: an operator decides it.
    NotUserApprovable,
    /// This approval is decided only with a passkey assertion over its intent (a profile or an
    /// amount tier requires it): a plain click is refused.
    PasskeyRequired,
    /// The passkey assertion does not verify: another intent or decision, another person's or a
    /// revoked credential, a replayed counter, or a bad signature.
    PasskeyInvalid,
    /// Registering a passkey needs more than the bearer token: an enrolment code issued for this
    /// person (always for the first), or an assertion by one of their live passkeys.
    EnrolmentRequired,
    /// The enrolment code is unknown, used, expired or issued for someone else.
    EnrolmentCodeInvalid,
    /// The thing is no longer in a state this action applies to (decided, revoked, reviewed).
    Conflict,
    /// The approval has expired.
    Expired,
    // What the HTTP framework answers alone, in the same envelope.
    MethodNotAllowed,
    Timeout,
    PayloadTooLarge,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::InsufficientScope => "INSUFFICIENT_SCOPE",
            ErrorCode::AccountNotAllowed => "ACCOUNT_NOT_ALLOWED",
            ErrorCode::ApprovalRequired => "APPROVAL_REQUIRED",
            ErrorCode::ApprovalRejected => "APPROVAL_REJECTED",
            ErrorCode::MandateInvalid => "MANDATE_INVALID",
            ErrorCode::MandateExpired => "MANDATE_EXPIRED",
            ErrorCode::MandateMismatch => "MANDATE_MISMATCH",
            ErrorCode::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            ErrorCode::OperationInProgress => "OPERATION_IN_PROGRESS",
            ErrorCode::InsufficientFunds => "INSUFFICIENT_FUNDS",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::BudgetExceeded => "BUDGET_EXCEEDED",
            ErrorCode::PrincipalSuspended => "PRINCIPAL_SUSPENDED",
            ErrorCode::BackendUnavailable => "BACKEND_UNAVAILABLE",
            ErrorCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::SelfReview => "SELF_REVIEW",
            ErrorCode::NotUserApprovable => "NOT_USER_APPROVABLE",
            ErrorCode::PasskeyRequired => "PASSKEY_REQUIRED",
            ErrorCode::PasskeyInvalid => "PASSKEY_INVALID",
            ErrorCode::EnrolmentRequired => "ENROLMENT_REQUIRED",
            ErrorCode::EnrolmentCodeInvalid => "ENROLMENT_CODE_INVALID",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::Expired => "EXPIRED",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
        }
    }

    /// The HTTP status each code answers with where it is an HTTP answer (the operator API,
    /// /approvals, the auth layer's refusals): the one table.
    pub fn http_status(self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            ErrorCode::InvalidArgument | ErrorCode::MandateInvalid | ErrorCode::MandateMismatch => S::BAD_REQUEST,
            ErrorCode::Unauthorized => S::UNAUTHORIZED,
            ErrorCode::InsufficientScope
            | ErrorCode::AccountNotAllowed
            | ErrorCode::SelfReview
            | ErrorCode::NotUserApprovable
            | ErrorCode::PasskeyRequired
            | ErrorCode::PasskeyInvalid
            | ErrorCode::EnrolmentRequired
            | ErrorCode::EnrolmentCodeInvalid
            | ErrorCode::PrincipalSuspended
            | ErrorCode::ApprovalRejected => S::FORBIDDEN,
            ErrorCode::NotFound => S::NOT_FOUND,
            ErrorCode::Conflict | ErrorCode::IdempotencyConflict | ErrorCode::OperationInProgress => S::CONFLICT,
            ErrorCode::Expired | ErrorCode::MandateExpired => S::GONE,
            ErrorCode::ApprovalRequired | ErrorCode::InsufficientFunds | ErrorCode::BudgetExceeded => {
                S::UNPROCESSABLE_ENTITY
            }
            ErrorCode::RateLimited => S::TOO_MANY_REQUESTS,
            ErrorCode::BackendUnavailable => S::SERVICE_UNAVAILABLE,
            ErrorCode::OutcomeUnknown => S::GATEWAY_TIMEOUT,
            ErrorCode::Internal => S::INTERNAL_SERVER_ERROR,
            ErrorCode::MethodNotAllowed => S::METHOD_NOT_ALLOWED,
            ErrorCode::Timeout => S::REQUEST_TIMEOUT,
            ErrorCode::PayloadTooLarge => S::PAYLOAD_TOO_LARGE,
        }
    }

    /// The code named `s`, by the same SCREAMING_SNAKE_CASE names serde writes (and `as_str`
    /// returns: a unit test holds the two equal for every code).
    pub fn parse(s: &str) -> Option<ErrorCode> {
        use serde::de::IntoDeserializer;
        let name: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = s.into_deserializer();
        ErrorCode::deserialize(name).ok()
    }

    /// Whether repeating the same call (same operation_id) may succeed later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::OperationInProgress
                | ErrorCode::RateLimited
                | ErrorCode::BackendUnavailable
                | ErrorCode::OutcomeUnknown
                | ErrorCode::Internal
                | ErrorCode::Timeout
        )
    }

    /// The gateway's own advice to the model. Fixed text per code: nothing from outside gets in.
    pub fn suggested_action(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => {
                "Fix the argument named in the message and call again with a new operation_id."
            }
            ErrorCode::InsufficientScope => {
                "This token lacks the scope for this tool; ask the user to grant it. Do not retry."
            }
            ErrorCode::AccountNotAllowed => "This agent may not use that account. Do not retry; tell the user.",
            ErrorCode::ApprovalRequired => {
                "A human must approve this payment. Tell the user the approval_id; do not retry or split the amount."
            }
            ErrorCode::ApprovalRejected => {
                "A human rejected this operation. Do not retry it, rephrase it or split it; tell the user."
            }
            ErrorCode::MandateInvalid => "The mandate is not valid. Do not retry with it; ask for a new approval.",
            ErrorCode::MandateExpired => "The mandate has expired. Ask the user for a new approval.",
            ErrorCode::MandateMismatch => {
                "The payment differs from what the mandate approved. Use exactly the approved payer, payee, amount and currency."
            }
            ErrorCode::IdempotencyConflict => {
                "This operation_id was already used with different arguments. Use a new operation_id for a new payment."
            }
            ErrorCode::OperationInProgress => {
                "The same operation is still running. Retry the same call with the same operation_id shortly."
            }
            ErrorCode::InsufficientFunds => {
                "The payer has too little money. This operation_id stays failed; a new attempt needs a new operation_id."
            }
            ErrorCode::NotFound => "Nothing with that id is visible to this agent. Check the id; do not guess others.",
            ErrorCode::RateLimited => "Too many calls. Wait retry_after_seconds, then retry the same call.",
            ErrorCode::BudgetExceeded => "The daily budget is used up. Tell the user; do not retry today.",
            ErrorCode::PrincipalSuspended => "This agent is suspended. Stop and tell the user.",
            ErrorCode::BackendUnavailable => {
                "The payment system is unavailable and nothing moved. Retry the same call with the same operation_id later."
            }
            ErrorCode::OutcomeUnknown => {
                "The outcome is not known yet. Retry the same call with the same operation_id; never use a new one for this payment."
            }
            ErrorCode::Internal => {
                "Something failed inside the gateway. Retry the same call with the same operation_id later."
            }
            ErrorCode::Unauthorized => "Sign in again: the credential is missing, expired or not for this resource.",
            ErrorCode::SelfReview => "Another person must do this: nobody acts on their own behalf.",
            ErrorCode::NotUserApprovable => "An operator must decide this approval: it is past the user's tier.",
            ErrorCode::PasskeyRequired => "Decide it with your passkey: this approval needs a passkey-signed decision.",
            ErrorCode::PasskeyInvalid => {
                "The passkey signature is not for this approval and decision: reload it and sign again."
            }
            ErrorCode::EnrolmentRequired => {
                "Registering a passkey needs an enrolment code another operator issued for you, or your existing passkey."
            }
            ErrorCode::EnrolmentCodeInvalid => {
                "The enrolment code is wrong, used, expired or someone else's: ask another operator for a new one."
            }
            ErrorCode::Conflict => "It has changed meanwhile (decided, reviewed or revoked): reload it.",
            ErrorCode::Expired => "The approval has expired: the agent must ask again.",
            ErrorCode::MethodNotAllowed => "Use a method this route allows (the Allow header names them).",
            ErrorCode::Timeout => "The request took too long; try again, or ask for less at once.",
            ErrorCode::PayloadTooLarge => "Send a smaller body.",
        }
    }
}

/// A refusal or failure, as the agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after_seconds: Option<u64>,
    /// Extra machine-readable fields (`approval_id`, `required_scopes`, ...), merged into the envelope.
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl AgentError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AgentError { code, message: message.into(), retry_after_seconds: None, details: Default::default() }
    }
    pub fn with_detail(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_seconds = Some(secs);
        self
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    pub fn internal() -> Self {
        Self::new(ErrorCode::Internal, "internal error")
    }

    /// The envelope: `{"error": {code, message, retryable, retry_after_seconds, suggested_action, correlation_id, ...}}`.
    pub fn envelope(&self, correlation_id: &str) -> serde_json::Value {
        let mut e = serde_json::Map::new();
        e.insert("code".into(), self.code.as_str().into());
        e.insert("message".into(), self.message.clone().into());
        e.insert("retryable".into(), self.code.retryable().into());
        e.insert("retry_after_seconds".into(), self.retry_after_seconds.map_or(serde_json::Value::Null, Into::into));
        e.insert("suggested_action".into(), self.code.suggested_action().into());
        e.insert("correlation_id".into(), correlation_id.into());
        for (k, v) in &self.details {
            // Details never replace the standard fields, except a more precise suggested action.
            if k == "suggested_action" {
                e.insert(k.clone(), v.clone());
            } else {
                e.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        serde_json::json!({ "error": e })
    }
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// Exhaustive: every backend error has exactly one agent meaning.
impl From<&BackendError> for AgentError {
    fn from(e: &BackendError) -> Self {
        match e {
            BackendError::AccountNotFound(a) => {
                AgentError::new(ErrorCode::NotFound, format!("account {a} does not exist"))
                    .with_detail("account_id", a.to_string())
            }
            BackendError::CurrencyMismatch { .. } | BackendError::SameAccount => AgentError::invalid(e.to_string()),
            BackendError::InsufficientFunds { .. } => AgentError::new(ErrorCode::InsufficientFunds, e.to_string()),
            BackendError::PaymentNotFound(p) => {
                AgentError::new(ErrorCode::NotFound, format!("payment {p} does not exist"))
                    .with_detail("payment_id", p.to_string())
            }
            BackendError::NotRefundable(_) | BackendError::RefundExceedsRemaining { .. } => {
                AgentError::invalid(e.to_string())
            }
            BackendError::IdempotencyKeyReused => AgentError::new(ErrorCode::IdempotencyConflict, e.to_string()),
            BackendError::BudgetExceeded(_) => AgentError::new(ErrorCode::BudgetExceeded, e.to_string()),
            BackendError::MandateExhausted(_) => AgentError::new(ErrorCode::MandateInvalid, e.to_string()),
            BackendError::Rejected(_) => AgentError::invalid(e.to_string()),
            BackendError::Unavailable(_) => {
                AgentError::new(ErrorCode::BackendUnavailable, "the payment system is unavailable; nothing moved")
                    .with_retry_after(1)
            }
            // The gateway answers a held key itself (replay, conflict, wait) before mapping anything.
            BackendError::KeyHeld { .. } => AgentError::new(ErrorCode::Internal, "internal error"),
            BackendError::OutcomeUnknown(_) => AgentError::new(
                ErrorCode::OutcomeUnknown,
                "the payment system did not confirm the outcome; retry with the same operation_id",
            )
            .with_retry_after(2),
        }
    }
}

impl From<crate::domain::money::MoneyError> for AgentError {
    fn from(e: crate::domain::money::MoneyError) -> Self {
        AgentError::invalid(e.to_string())
    }
}
impl From<crate::domain::ids::IdError> for AgentError {
    fn from(e: crate::domain::ids::IdError) -> Self {
        AgentError::invalid(e.to_string())
    }
}

/// Policy's refusal, in the agent's terms (the same codes, sentences and details as always).
impl From<Refusal> for AgentError {
    fn from(r: Refusal) -> Self {
        let message = r.to_string();
        match r {
            Refusal::MissingScope { required, .. } => {
                AgentError::new(ErrorCode::InsufficientScope, message).with_detail("required_scopes", required)
            }
            Refusal::AccountNotAllowed(a) => {
                AgentError::new(ErrorCode::AccountNotAllowed, message).with_detail("account_id", a.to_string())
            }
            Refusal::PayeeNotAllowed(payee) => {
                AgentError::new(ErrorCode::AccountNotAllowed, message).with_detail("payee", payee)
            }
            Refusal::Invalid(_) => AgentError::invalid(message),
        }
    }
}

/// A mandate refused: expired, not valid for this agent, or not what this call is.
impl From<MandateError> for AgentError {
    fn from(e: MandateError) -> Self {
        let code = match e {
            MandateError::Expired => ErrorCode::MandateExpired,
            ref m if m.is_mismatch() => ErrorCode::MandateMismatch,
            _ => ErrorCode::MandateInvalid,
        };
        AgentError::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    /// What `policy simulate` reports for a refusal is the code the agent was told.
    #[test]
    fn a_refusals_code_is_the_agents_code() {
        use crate::domain::policy::Refusal;
        let refusals = [
            Refusal::MissingScope { tool: "t".into(), missing: "s".into(), required: vec!["s".into()] },
            Refusal::AccountNotAllowed(crate::domain::ids::AccountId::parse("acct-Z").unwrap()),
            Refusal::PayeeNotAllowed("mpesa-254700000000".into()),
            Refusal::Invalid("bad"),
        ];
        let codes = refusals.map(|r| (r.code(), super::AgentError::from(r).code.as_str()));
        assert_eq!(
            codes.map(|(mine, agents)| (mine == agents, mine)),
            [
                (true, "INSUFFICIENT_SCOPE"),
                (true, "ACCOUNT_NOT_ALLOWED"),
                (true, "ACCOUNT_NOT_ALLOWED"),
                (true, "INVALID_ARGUMENT"),
            ]
        );
    }

    /// The operator API's documented statuses (docs/operator-api.yaml) come from the one table.
    #[test]
    fn every_code_round_trips_and_operator_codes_answer_their_documented_status() {
        use ErrorCode::*;
        let every = [
            InvalidArgument,
            InsufficientScope,
            AccountNotAllowed,
            ApprovalRequired,
            ApprovalRejected,
            MandateInvalid,
            MandateExpired,
            MandateMismatch,
            IdempotencyConflict,
            OperationInProgress,
            InsufficientFunds,
            NotFound,
            RateLimited,
            BudgetExceeded,
            PrincipalSuspended,
            BackendUnavailable,
            OutcomeUnknown,
            Internal,
            Unauthorized,
            SelfReview,
            NotUserApprovable,
            PasskeyRequired,
            PasskeyInvalid,
            EnrolmentRequired,
            EnrolmentCodeInvalid,
            Conflict,
            Expired,
            MethodNotAllowed,
            Timeout,
            PayloadTooLarge,
        ];
        for code in every {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code), "{}", code.as_str());
            assert_eq!(serde_json::to_value(code).unwrap(), serde_json::json!(code.as_str()));
        }
        assert_eq!(ErrorCode::parse("NOT_A_CODE"), None);
        let status = |c: ErrorCode| c.http_status().as_u16();
        assert_eq!(
            [ErrorCode::InvalidArgument, ErrorCode::Unauthorized, ErrorCode::InsufficientScope, ErrorCode::SelfReview]
                .map(status),
            [400, 401, 403, 403]
        );
        assert_eq!(
            [ErrorCode::NotUserApprovable, ErrorCode::NotFound, ErrorCode::Conflict, ErrorCode::Expired].map(status),
            [403, 404, 409, 410]
        );
        assert_eq!([ErrorCode::RateLimited, ErrorCode::Internal, ErrorCode::Timeout].map(status), [429, 500, 408]);
    }
}
