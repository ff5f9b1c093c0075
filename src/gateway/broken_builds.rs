//! The deliberately broken builds the evals and the fault suite must catch (test-only features;
//! `.ci/run` builds them, never a release).

/// A deliberately broken build for the evals (`--features broken-gateways-for-evals`), chosen at
/// run time by `PAYGATE_EVALS_BROKEN`: "refuse-all" (every tool call refused with one code),
/// "http-500" (every tool call answered HTTP 500) or "allow-all" (policy answers Allow to every
/// money movement: no approval, limit, budget or payee rule). `.ci/run` checks that the evals catch
/// each.
#[cfg(feature = "broken-gateways-for-evals")]
pub fn broken_for_evals() -> Option<&'static str> {
    match std::env::var("PAYGATE_EVALS_BROKEN").as_deref() {
        Ok("refuse-all") => Some("refuse-all"),
        Ok("http-500") => Some("http-500"),
        Ok("allow-all") => Some("allow-all"),
        _ => None,
    }
}

/// The weakened-idempotency build (`--features weaken-idempotency-for-evals`) weakens keys unless
/// another broken build is chosen at run time (`PAYGATE_EVALS_BROKEN`): each is caught on its own.
#[cfg(feature = "weaken-idempotency-for-evals")]
pub(crate) fn idempotency_weakened() -> bool {
    #[cfg(feature = "broken-gateways-for-evals")]
    if broken_for_evals().is_some() {
        return false;
    }
    true
}
