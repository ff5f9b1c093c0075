//! `paygate stdio`: the gateway for one agent over stdin/stdout (`mcp::stdio`), for MCP clients
//! that start their servers as subprocesses. The agent is the bearer token in `PAYGATE_TOKEN`,
//! checked before anything is served: no token, or one that is not an agent's for this gateway
//! (bad signature, another issuer or audience, expired, an operator's), is one sentence on stderr
//! and exit 2, with stdin never read and the store never opened.
//!
//! Background work runs as under `serve` (when `jobs.enabled`): the policy refresh and the
//! scheduler, so a collection pending on a rail settles by polling, approvals expire, idempotency
//! records are purged and the audit trail is sealed while the client is connected. Each job takes
//! its lease in the store first: a `paygate serve` on the same store (or several stdio processes)
//! shares the work rather than doubling it.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::auth::Secret;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::mcp::stdio::{StdioServer, check_token};

/// The environment variable the agent's token is read from.
pub const TOKEN_VAR: &str = "PAYGATE_TOKEN";
/// How long the end waits for work still running: a read of a stdin that is not a pipe (a file, a
/// terminal) runs on a blocking thread and cannot be cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub(super) fn run(file: Option<&Path>) -> ExitCode {
    // The token before anything else, the config included: nothing starts without one.
    let token = match std::env::var(TOKEN_VAR) {
        Ok(t) if !t.trim().is_empty() => Secret::new(t.trim().to_string()),
        _ => {
            crate::logging::fatal(
                "PAYGATE_TOKEN is not set: paygate stdio serves the one agent whose token it holds (an agent's \
                 access token; for a local dev one: paygate token --sub <agent> --scope \"payments:read payments:create\")",
            );
            return ExitCode::from(2);
        }
    };
    super::with_config(file, |config| serve(config, token))
}

fn serve(config: Config, token: Secret) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            crate::logging::fatal(&format!("cannot start runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        let Ok(telemetry) = super::start_logs(&config) else { return ExitCode::FAILURE };
        let code = serve_on(config, token).await;
        if let Some(t) = telemetry {
            t.shutdown().await;
        }
        code
    });
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    code
}

async fn serve_on(config: Config, token: Secret) -> ExitCode {
    let first = match crate::app::HeadlessStart::new(config, Arc::new(SystemClock)) {
        Ok(f) => f,
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    // Judged before any state is opened: signature, issuer, audience, expiry, not an operator's.
    if let Err(refused) = check_token(&first.agents(), &token, None).await {
        crate::logging::fatal(&refused.to_string());
        return ExitCode::from(2);
    }
    let mut headless = match first.start().await {
        Ok(h) => h,
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    let code = match check_token(&headless.agents, &token, Some(&headless.gateway)).await {
        Ok(principal) => {
            tracing::info!(
                principal.sub = %principal.display(),
                policy.profile = %principal.profile.name,
                "serving MCP on stdin/stdout"
            );
            let stop = CancellationToken::new();
            let on_signal = stop.clone();
            tokio::spawn(async move {
                super::shutdown_signal().await;
                on_signal.cancel();
            });
            let server =
                StdioServer::new(headless.gateway.clone(), &headless.disabled_tools, headless.agents.clone(), token);
            match server.serve(stop).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    crate::logging::fatal(&format!("stdio: {e}"));
                    ExitCode::FAILURE
                }
            }
        }
        Err(refused) => {
            crate::logging::fatal(&refused.to_string());
            ExitCode::from(2)
        }
    };
    tracing::info!("stdio closed; stopping");
    headless.shutdown().await;
    // Nothing this process audited is left unsealed (editable) while it is down.
    headless.gateway.seal_audit_at_stop().await;
    code
}
