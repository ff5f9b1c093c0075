//! Rails simulated inside the gateway (`mpesa.environment` / `airtel.environment` = "simulator"):
//! what every rail's simulator offers the HTTP edge. Each serves its rail's API under
//! `/simulator/<rail>` (the gateway's own client calls it over HTTP, exactly as it calls the real
//! rail) and is steered by a person through the operator's control routes
//! (`/simulator/control/<rail>`): answer a pending item, or lose the next answer. None of them moves
//! money anywhere; each is bounded ([`SIMULATOR_ITEMS_MAX`]) and in memory.

use async_trait::async_trait;
use serde_json::Value;

/// Prompts and payments one simulator keeps; past this it refuses new ones (503, unprocessed).
pub const SIMULATOR_ITEMS_MAX: usize = 10_000;

/// Where a rail's simulated API is served on the gateway (its client's base URL is the public URL
/// and this).
pub fn path(rail: &str) -> String {
    format!("/simulator/{rail}")
}

/// How a person answers a pending prompt or payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The customer paid (a prompt), or the rail completed the payment.
    Accept,
    /// The customer cancelled, or the rail refused the payment.
    Decline,
    /// The phone never answered (a prompt). For a payment, each rail says what it means (M-Pesa:
    /// completed with its result lost; Airtel: completed, found by the enquiry).
    Timeout,
}

impl Answer {
    /// `accept`, `decline`, `timeout`.
    pub fn parse(s: &str) -> Option<Answer> {
        match s {
            "accept" => Some(Answer::Accept),
            "decline" => Some(Answer::Decline),
            "timeout" => Some(Answer::Timeout),
            _ => None,
        }
    }
}

/// One rail's simulator, as the HTTP edge sees it.
#[async_trait]
pub trait RailSimulator: Send + Sync + 'static {
    /// The rail it simulates (`mpesa`, `airtel`): its routes live under `/simulator/<rail>`.
    fn rail(&self) -> &'static str;
    /// The rail's API, to be nested under [`path`].
    fn router(&self) -> axum::Router;
    /// Every prompt and payment, newest first, and whether the next answer will be lost.
    fn view(&self) -> Value;
    /// The next money request is processed and its answer never sent.
    fn lose_next_answer(&self);
    /// Answers a pending item (`id`, or "latest": the newest pending one) and tells the gateway as
    /// the rail would: the item's id and the HTTP status the gateway gave the callback, if one was
    /// posted. `Err`: no such pending item (a sentence).
    async fn answer(&self, id: &str, answer: Answer) -> Result<(String, Option<u16>), String>;
}
