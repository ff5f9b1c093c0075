//! Rails simulated inside the gateway (`mpesa.environment` / `airtel.environment` = "simulator"),
//! or in a process of their own (`paygate rail-simulator`, [`super::simulator_server`]): what every
//! rail's simulator offers an HTTP edge. Inside the gateway each serves its rail's API under
//! `/simulator/<rail>` (the gateway's own client calls it over HTTP, exactly as it calls the real
//! rail) and is steered by a person through the operator's control routes
//! (`/simulator/control/<rail>`): answer a pending item, or lose the next answer. Standalone, it
//! serves the same API at its root and may answer every item by itself ([`AutoAnswer`]). None of
//! them moves money anywhere; each is bounded ([`SIMULATOR_ITEMS_MAX`] by default) and in memory.

use async_trait::async_trait;
use serde_json::Value;

/// Prompts and payments one simulator keeps; past this it refuses new ones (503, unprocessed).
/// The default; `paygate rail-simulator --items-max` sets it, up to [`SIMULATOR_ITEMS_MAX_BOUND`].
pub const SIMULATOR_ITEMS_MAX: usize = 10_000;

/// The most `--items-max` may be (every item is kept in memory and listed by the records view).
pub const SIMULATOR_ITEMS_MAX_BOUND: usize = 200_000;

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

/// A standalone simulator's own answer to every prompt and payment it takes (`--auto`), so a load
/// test needs no person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoAnswer {
    pub answer: Answer,
    /// How long after the request the answer comes (the rail's "customer" is this quick).
    pub after: std::time::Duration,
}

/// Which item a person (or the auto-answer) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<'a> {
    /// The newest pending one.
    Latest,
    /// The pending one with this id (the pending one, when a repeated request reused the id), or
    /// else the answered one (for the sentence saying so).
    Id(&'a str),
    /// The one the simulator numbered so (each item has its own number, repeats included).
    Seq(u64),
}

impl<'a> Pick<'a> {
    /// `latest`, or an item's id.
    pub fn parse(id: &'a str) -> Pick<'a> {
        match id {
            "latest" => Pick::Latest,
            _ => Pick::Id(id),
        }
    }
}

impl std::fmt::Display for Pick<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pick::Latest => f.write_str("latest"),
            Pick::Id(id) => f.write_str(id),
            Pick::Seq(seq) => write!(f, "#{seq}"),
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
    /// Every prompt and payment, newest first, and whether the next answer will be lost. Each item
    /// has its own `seq`, the rail's id for it (`rail_id`) and the id its caller chose
    /// (`originator_id`, `null` where the rail takes none): a repeated request is listed again
    /// under the same `originator_id`, never folded into the first.
    fn view(&self) -> Value;
    /// The next money request is processed and its answer never sent.
    fn lose_next_answer(&self);
    /// Answers a pending item and tells the gateway as the rail would: the item's id and the HTTP
    /// status the gateway gave the callback, if one was posted. `Err`: no such pending item (a
    /// sentence).
    async fn answer(&self, pick: Pick<'_>, answer: Answer) -> Result<(String, Option<u16>), String>;
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

/// The pending item a person answers (see [`Pick`]). `Err`: a sentence (no such item, or answered
/// already).
pub fn pending<'a, T>(
    items: &'a mut [T],
    pick: Pick<'_>,
    id_of: impl Fn(&T) -> &str,
    seq_of: impl Fn(&T) -> u64,
    status_of: impl Fn(&T) -> &'static str,
) -> Result<&'a mut T, String> {
    let position = match pick {
        Pick::Latest => items.iter().rposition(|i| status_of(i) == "pending"),
        Pick::Id(id) => items
            .iter()
            .position(|i| id_of(i) == id && status_of(i) == "pending")
            .or_else(|| items.iter().position(|i| id_of(i) == id)),
        Pick::Seq(seq) => items.iter().position(|i| seq_of(i) == seq),
    };
    match position.and_then(|p| items.get_mut(p)) {
        None => Err(format!("no pending prompt or payment {pick}")),
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
        type I = (u64, &'static str, &'static str);
        let mut items: Vec<I> =
            vec![(1, "a", "paid"), (2, "b", "pending"), (3, "c", "pending"), (4, "d", "declined"), (5, "a", "pending")];
        fn seq(i: &I) -> u64 {
            i.0
        }
        fn id(i: &I) -> &str {
            i.1
        }
        fn status(i: &I) -> &'static str {
            i.2
        }
        let latest = pending(&mut items, Pick::Latest, id, seq, status).unwrap();
        assert_eq!(latest.0, 5, "the newest pending one");
        assert_eq!(pending(&mut items, Pick::Id("a"), id, seq, status).unwrap().0, 5, "a repeat's pending one");
        items[4].2 = "paid";
        assert_eq!(pending(&mut items, Pick::Latest, id, seq, status).unwrap().0, 3);
        assert_eq!(pending(&mut items, Pick::Id("b"), id, seq, status).unwrap().0, 2);
        assert_eq!(pending(&mut items, Pick::Seq(3), id, seq, status).unwrap().1, "c");
        let repeated = pending(&mut items, Pick::Id("a"), id, seq, status).unwrap_err();
        assert!(repeated.contains("already answered (paid)"), "{repeated}");
        // A pick nothing answers is named as the person wrote it, so they see what they asked for.
        assert_eq!(pending(&mut items, Pick::Id("z"), id, seq, status).unwrap_err(), "no pending prompt or payment z");
        assert_eq!(
            pending(&mut items, Pick::Seq(99), id, seq, status).unwrap_err(),
            "no pending prompt or payment #99"
        );
        for i in items.iter_mut() {
            i.2 = "paid";
        }
        assert_eq!(
            pending(&mut items, Pick::Latest, id, seq, status).unwrap_err(),
            "no pending prompt or payment latest"
        );
        assert!(pending(&mut items, Pick::Seq(4), id, seq, status).unwrap_err().contains("already answered"));
    }
}
