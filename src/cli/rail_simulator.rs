//! `paygate rail-simulator`: one rail's simulator (`backend::mpesa::simulator`,
//! `backend::airtel::simulator`) in a process of its own, served by
//! `backend::simulator_server`. It expects the credentials of the config it is given (the
//! gateways' own `[mpesa]` or `[airtel]`), so one config file serves both sides.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Secret;
use crate::backend::simulator::{Answer, AutoAnswer, RailSimulator};
use crate::config::Config;

/// The longest `--auto-after-ms`, in milliseconds (ten minutes: past any client's patience).
pub const AUTO_AFTER_MS_MAX: u64 = 600_000;
/// The shortest control token accepted, in characters (a short one is guessed).
pub const CONTROL_TOKEN_CHARS_MIN: usize = 16;

/// The rail a simulator plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rail {
    /// Safaricom's Daraja: STK push and query, B2C, B2B, reversals, the Transaction Status API.
    Mpesa,
    /// Airtel Money Kenya: collections, refunds, disbursements and their enquiries.
    Airtel,
}

/// How every prompt and payment is answered with `--auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Auto {
    /// The customer pays; the rail completes the payment.
    Accept,
    /// The customer cancels; the rail refuses the payment.
    Decline,
    /// The phone never answers (a prompt); a payment completes with its result lost (M-Pesa) or
    /// expires (Airtel).
    Timeout,
}

/// What the command line gave.
pub struct Options {
    pub rail: Rail,
    pub bind: String,
    pub callback_base_url: Option<String>,
    pub auto: Option<Auto>,
    pub auto_after_ms: u64,
    pub control_token: Option<String>,
    pub pin_key_file: Option<std::path::PathBuf>,
    pub items_max: usize,
}

/// Runs the simulator until SIGINT or SIGTERM. Prints `paygate rail simulator (<rail>): http://ADDR`
/// on stdout once it listens. Exit 2: the options or the config do not make a simulator.
pub fn run(config: Config, opts: Options) -> ExitCode {
    super::init_tracing();
    crate::install_crypto_provider();
    let (sim, token) = match simulator(&config, &opts) {
        Ok(made) => made,
        Err(why) => {
            crate::logging::fatal(&format!("rail-simulator: {why}"));
            return ExitCode::from(2);
        }
    };
    let Some(rt) = super::runtime() else { return ExitCode::FAILURE };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&opts.bind).await {
            Ok(l) => l,
            Err(e) => {
                crate::logging::fatal(&format!("cannot bind {}: {e}", opts.bind));
                return ExitCode::FAILURE;
            }
        };
        if let Ok(addr) = listener.local_addr() {
            super::say(format_args!("paygate rail simulator ({}): http://{addr}", sim.rail()));
        }
        match crate::backend::simulator_server::serve(listener, sim, token, super::shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                crate::logging::fatal(&format!("rail-simulator: {e}"));
                ExitCode::FAILURE
            }
        }
    })
}

/// The simulator the options and config describe, and its control token. `Err`: a sentence.
fn simulator(config: &Config, opts: &Options) -> Result<(Arc<dyn RailSimulator>, Option<Secret>), String> {
    if opts.auto_after_ms > AUTO_AFTER_MS_MAX {
        return Err(format!("--auto-after-ms must be at most {AUTO_AFTER_MS_MAX}"));
    }
    let bound = crate::backend::simulator::SIMULATOR_ITEMS_MAX_BOUND;
    if opts.items_max == 0 || opts.items_max > bound {
        return Err(format!("--items-max must be between 1 and {bound}"));
    }
    let auto = opts.auto.map(|a| AutoAnswer {
        answer: match a {
            Auto::Accept => Answer::Accept,
            Auto::Decline => Answer::Decline,
            Auto::Timeout => Answer::Timeout,
        },
        after: Duration::from_millis(opts.auto_after_ms),
    });
    let token = match opts.control_token.as_deref() {
        None | Some("") => None,
        Some(t) if t.chars().count() < CONTROL_TOKEN_CHARS_MIN => {
            return Err(format!("the control token must be at least {CONTROL_TOKEN_CHARS_MIN} characters"));
        }
        Some(t) => Some(Secret::new(t.to_string())),
    };
    let public_url = crate::app::configured_public_url(config);
    let sim: Arc<dyn RailSimulator> = match opts.rail {
        Rail::Mpesa => {
            if opts.callback_base_url.is_some() || opts.pin_key_file.is_some() {
                return Err("--callback-base-url and --pin-key-file are Airtel's: Daraja is told where to call \
                            back in each request"
                    .into());
            }
            let m = &config.mpesa;
            required(&[
                ("mpesa.consumer_key", m.consumer_key.expose()),
                ("mpesa.consumer_secret", m.consumer_secret.expose()),
                ("mpesa.short_code", &m.short_code),
                ("mpesa.passkey", m.passkey.expose()),
            ])?;
            let cfg = crate::app::daraja_config(config, &public_url);
            Arc::new(crate::backend::mpesa::simulator::DarajaSimulator::standalone(cfg, auto, opts.items_max)?)
        }
        Rail::Airtel => {
            let a = &config.airtel;
            required(&[
                ("airtel.client_id", a.client_id.expose()),
                ("airtel.client_secret", a.client_secret.expose()),
            ])?;
            let key = opts.pin_key_file.as_deref().map(pin_key).transpose()?;
            if key.is_none() && !a.disbursement_pin.expose().is_empty() {
                tracing::warn!(
                    "rail-simulator: no --pin-key-file, so PINs are sealed with a fresh key no gateway knows: \
                     every disbursement will be refused (Incorrect PIN)"
                );
            }
            let base = opts.callback_base_url.as_deref().unwrap_or(&public_url);
            let terms = crate::app::airtel_simulator_terms(config, base);
            Arc::new(crate::backend::airtel::simulator::AirtelSimulator::standalone(terms, key, auto, opts.items_max)?)
        }
    };
    Ok((sim, token))
}

/// `Err` naming the first empty key: the simulator checks what the gateway sends against them.
fn required(keys: &[(&str, &str)]) -> Result<(), String> {
    match keys.iter().find(|(_, v)| v.is_empty()) {
        Some((key, _)) => Err(format!("{key} is empty: the simulator expects the gateway's credentials")),
        None => Ok(()),
    }
}

/// The Airtel simulator's PIN key: an RSA private key, PKCS#8 PEM.
fn pin_key(path: &std::path::Path) -> Result<rsa::PrivateKey, String> {
    use rsa::pkcs8::DecodePrivateKey as _;
    let text = std::fs::read_to_string(path).map_err(|e| format!("--pin-key-file {}: {e}", path.display()))?;
    rsa::PrivateKey::from_pkcs8_pem(&text)
        .map_err(|e| format!("--pin-key-file {}: not an RSA private key in PKCS#8 PEM: {e}", path.display()))
}
