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

/// How many of a simulator's tokens are live at once; older ones are forgotten (the client
/// refreshes its token on a 401, as with the real rail).
pub const LIVE_TOKENS_MAX: usize = 16;

/// The OAuth tokens a simulator issued, the newest [`LIVE_TOKENS_MAX`].
#[derive(Debug, Default)]
pub struct Tokens(std::collections::VecDeque<String>);

impl Tokens {
    /// A fresh token, now live.
    pub fn issue(&mut self) -> String {
        let token = format!("sim-{}", uuid::Uuid::new_v4().simple());
        if self.0.len() >= LIVE_TOKENS_MAX {
            self.0.pop_front();
        }
        self.0.push_back(token.clone());
        token
    }

    /// Whether an `Authorization` header value is `Bearer` and a live token.
    pub fn authorize(&self, authorization: Option<&str>) -> bool {
        authorization.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|t| self.0.iter().any(|k| k == t))
    }
}

/// The pending item a person answers: `id`, or "latest" (the newest pending one). `Err`: a sentence
/// (no such item, or answered already).
pub fn pending<'a, T>(
    items: &'a mut [T],
    id: &str,
    id_of: impl Fn(&T) -> &str,
    status_of: impl Fn(&T) -> &'static str,
) -> Result<&'a mut T, String> {
    let found = match id {
        "latest" => items.iter_mut().rev().find(|i| status_of(i) == "pending"),
        _ => items.iter_mut().find(|i| id_of(i) == id),
    };
    match found {
        None => Err(format!("no pending prompt or payment {id}")),
        Some(item) if status_of(item) != "pending" => {
            Err(format!("{} was already answered ({})", id_of(item), status_of(item)))
        }
        Some(item) => Ok(item),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bearer_and_only_the_newest_live() {
        let mut tokens = Tokens::default();
        let first = tokens.issue();
        assert!(tokens.authorize(Some(&format!("Bearer {first}"))));
        assert!(!tokens.authorize(Some(&first)) && !tokens.authorize(None) && !tokens.authorize(Some("Bearer x")));
        for _ in 0..LIVE_TOKENS_MAX {
            tokens.issue();
        }
        assert!(!tokens.authorize(Some(&format!("Bearer {first}"))), "forgotten");
    }

    #[test]
    fn a_person_answers_a_pending_item_once() {
        let mut items = vec![("a", "paid"), ("b", "pending"), ("c", "pending"), ("d", "declined")];
        let (id, status) = (|i: &(&str, &'static str)| i.0.to_string(), |i: &(&str, &'static str)| i.1);
        let latest = pending(&mut items, "latest", |i| i.0, status).unwrap();
        assert_eq!(id(latest), "c");
        assert_eq!(pending(&mut items, "b", |i| i.0, status).unwrap().0, "b");
        assert!(pending(&mut items, "a", |i| i.0, status).unwrap_err().contains("already answered (paid)"));
        assert!(pending(&mut items, "z", |i| i.0, status).unwrap_err().contains("no pending"));
    }
}
