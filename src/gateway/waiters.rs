//! Local waiters: a duplicate call waiting on an in-flight idempotency key, or a retry held for an
//! approval's decision, sleeps on a `Notify` here and is woken when the holder finishes. Waiters
//! also poll the store, which covers holders in other replicas.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The waiter registry, by key (an idempotency key, or an approval's decision key).
#[derive(Default)]
pub(super) struct Waiters(Mutex<HashMap<String, Arc<Notify>>>);

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `Notify` woken when `key`'s holder finishes.
    pub fn waiter(&self, key: &str) -> Arc<Notify> {
        self.map().entry(key.to_string()).or_default().clone()
    }

    /// Forget a waiter entry that nobody waits on any more (one that will never be woken).
    pub fn unwait(&self, key: &str) {
        let mut map = self.map();
        if map.get(key).is_some_and(|n| Arc::strong_count(n) == 1) {
            map.remove(key);
        }
    }

    /// Wake everyone waiting on `key`.
    pub fn wake(&self, key: &str) {
        let removed = self.map().remove(key);
        if let Some(n) = removed {
            n.notify_waiters();
        }
    }
}

impl super::Gateway {
    pub(super) fn waiter(&self, key: &str) -> Arc<Notify> {
        self.waiters.waiter(key)
    }
    pub(super) fn unwait(&self, key: &str) {
        self.waiters.unwait(key)
    }
    pub(super) fn wake(&self, key: &str) {
        self.waiters.wake(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_woken_key_wakes_its_waiters_and_is_forgotten() {
        let w = Waiters::default();
        let n = w.waiter("k");
        let notified = n.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        w.wake("k");
        notified.await;
        assert!(w.map().is_empty());
    }

    #[test]
    fn an_unwaited_key_is_forgotten_only_when_nobody_holds_it() {
        let w = Waiters::default();
        let held = w.waiter("k");
        w.unwait("k");
        assert!(w.map().contains_key("k"), "still waited on");
        drop(held);
        w.unwait("k");
        assert!(w.map().is_empty());
    }
}
