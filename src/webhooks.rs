//! Webhook delivery (Standard Webhooks, <https://www.standardwebhooks.com/>): the job that sends the
//! outbox's due messages (`domain::webhook`), signed, with retries on an exponential schedule and a
//! circuit breaker per endpoint. At least once: a message is marked delivered only after its
//! endpoint answered 2xx, so a crash between the answer and the mark sends it again — with the same
//! `webhook-id`, which receivers de-duplicate on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::clock::{Clock, UnixSecs};
use crate::domain::webhook::{DeliveryAttempt, OutboxMessage, next_attempt};
use crate::secret::Secret;
use crate::store::{AttemptOutcome, Store};

/// Longest error text kept per attempt.
const ERROR_CHARS_MAX: usize = 200;

/// The `webhook-signature` of a message: `v1,` + base64 HMAC-SHA256 over `id.timestamp.body` under
/// the endpoint's key (the bytes of its `whsec_` secret).
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &str) -> String {
    // HMAC takes a key of any length: this never fails.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

/// One endpoint, as the delivery job uses it.
pub struct Endpoint {
    pub name: String,
    pub url: String,
    pub secret: Secret,
}

/// How delivery behaves (config `webhooks`, ranges checked at load).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub batch_max: i64,
    pub attempts_max: i64,
    pub backoff_initial_secs: i64,
    pub backoff_max_secs: i64,
    pub timeout: Duration,
    pub breaker_failures: i64,
    pub breaker_open_secs: i64,
}

#[derive(Default)]
struct Breaker {
    failures_in_a_row: i64,
    open_until: Option<UnixSecs>,
}

pub struct Webhooks {
    endpoints: HashMap<String, (Endpoint, Vec<u8>)>,
    settings: Settings,
    client: reqwest::Client,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    breakers: Mutex<HashMap<String, Breaker>>,
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Run {
    pub delivered: usize,
    pub failed: usize,
    /// Messages left waiting because their endpoint's breaker is open.
    pub held: usize,
    /// Each attempt: its endpoint and "delivered", "failed" (tried again later) or "gave_up".
    pub attempts: Vec<(String, &'static str)>,
    /// Each endpoint, and whether its breaker is open, as the run ends.
    pub breakers: Vec<(String, bool)>,
}

impl Webhooks {
    /// `endpoints` with keys that decode (config checked them); `None` when none does.
    pub fn new(
        endpoints: Vec<Endpoint>,
        settings: Settings,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<Webhooks, String> {
        let mut by_name = HashMap::new();
        for ep in endpoints {
            let key = crate::domain::webhook::key(ep.secret.expose())
                .ok_or_else(|| format!("webhook endpoint {}: its secret does not decode", ep.name))?;
            by_name.insert(ep.name.clone(), (ep, key));
        }
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("webhook client: {e}"))?;
        Ok(Webhooks { endpoints: by_name, settings, client, store, clock, breakers: Mutex::new(HashMap::new()) })
    }

    fn breaker_open(&self, endpoint: &str, now: UnixSecs) -> bool {
        let b = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        b.get(endpoint).and_then(|b| b.open_until).is_some_and(|t| now < t)
    }

    fn note(&self, endpoint: &str, ok: bool, now: UnixSecs) {
        let mut all = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        let b = all.entry(endpoint.to_string()).or_default();
        if ok {
            *b = Breaker::default();
            return;
        }
        b.failures_in_a_row += 1;
        if b.failures_in_a_row >= self.settings.breaker_failures {
            b.open_until = Some(now + self.settings.breaker_open_secs);
            b.failures_in_a_row = 0;
            tracing::warn!(webhook.endpoint = endpoint, "webhook endpoint failing: its breaker is open");
        }
    }

    /// Send what is due, until `budget` runs out.
    pub async fn deliver_due(&self, budget: Duration) -> Run {
        let started = Instant::now();
        let mut run = Run::default();
        let now = self.clock.now();
        let due = match self.store.outbox_due(now, self.settings.batch_max).await {
            Ok(d) => d,
            Err(error) => {
                tracing::warn!(%error, "webhook outbox read failed");
                return run;
            }
        };
        for m in due {
            if started.elapsed() >= budget {
                break;
            }
            if self.breaker_open(&m.endpoint, self.clock.now()) {
                run.held += 1;
                continue;
            }
            let Some(outcome) = self.send(&m).await else { continue };
            let counted = match outcome {
                AttemptOutcome::Delivered => "delivered",
                AttemptOutcome::GiveUp => "gave_up",
                AttemptOutcome::RetryAt(_) => "failed",
            };
            match outcome {
                AttemptOutcome::Delivered => run.delivered += 1,
                _ => run.failed += 1,
            }
            run.attempts.push((m.endpoint.clone(), counted));
        }
        let now = self.clock.now();
        run.breakers = self.endpoints.keys().map(|e| (e.clone(), self.breaker_open(e, now))).collect();
        run
    }

    /// One attempt; `Some(its outcome)`, or `None` when the message's endpoint is gone from config
    /// (it waits: an endpoint put back delivers it).
    async fn send(&self, m: &OutboxMessage) -> Option<AttemptOutcome> {
        let (ep, key) = self.endpoints.get(&m.endpoint)?;
        let ts = self.clock.now();
        let sent = Instant::now();
        let answer = self
            .client
            .post(&ep.url)
            .header("content-type", "application/json")
            .header("webhook-id", &m.id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature(key, &m.id, ts, &m.body))
            .body(m.body.clone())
            .send()
            .await;
        let duration_ms = i64::try_from(sent.elapsed().as_millis()).unwrap_or(i64::MAX);
        let (status, error) = match answer {
            Ok(r) if r.status().is_success() => (Some(i64::from(r.status().as_u16())), None),
            Ok(r) => (Some(i64::from(r.status().as_u16())), Some(format!("answered {}", r.status().as_u16()))),
            Err(e) if e.is_timeout() => (None, Some("timed out".to_string())),
            Err(e) if e.is_connect() => (None, Some("could not connect".to_string())),
            Err(e) => (None, Some(e.to_string().chars().take(ERROR_CHARS_MAX).collect())),
        };
        let ok = error.is_none();
        let now = self.clock.now();
        self.note(&m.endpoint, ok, now);
        let attempt = m.attempts + 1;
        let outcome = if ok {
            AttemptOutcome::Delivered
        } else if attempt >= self.settings.attempts_max {
            AttemptOutcome::GiveUp
        } else {
            let s = &self.settings;
            AttemptOutcome::RetryAt(next_attempt(now, m.attempts, s.backoff_initial_secs, s.backoff_max_secs))
        };
        if let Some(why) = &error {
            tracing::warn!(webhook.id = %m.id, webhook.endpoint = %m.endpoint, attempt, error = %why, "webhook not delivered");
        }
        let record = DeliveryAttempt { message_id: m.id.clone(), attempt, at: now, status, error, duration_ms };
        if let Err(error) = self.store.outbox_attempted(record, outcome).await {
            // Not recorded: the message stays due and goes again (at least once).
            tracing::error!(%error, webhook.id = %m.id, "webhook attempt not recorded");
        }
        Some(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's own example: secret, id, timestamp, body, signature.
    #[test]
    fn signatures_match_the_specifications_example() {
        let key = crate::domain::webhook::key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_or_default();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
