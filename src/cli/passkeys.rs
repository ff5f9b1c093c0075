//! `paygate passkeys enrol-code --owner alice`: an enrolment code for a person's passkey, issued at
//! the box by whoever holds the config (out of band: no operator token is involved). The code is
//! printed once on stdout, stored only as its hash, audited as issued by `cli:<login>`.

use std::process::ExitCode;

use crate::config::Config;

/// The issuer the person's operator tokens carry: the configured identity provider's, else the
/// dev key's (as `paygate policy` does).
fn default_issuer(config: &Config) -> String {
    if config.auth.issuer.is_empty() {
        crate::app::dev_issuer(config, &crate::app::configured_public_url(config))
    } else {
        config.auth.issuer.clone()
    }
}

pub fn enrol_code(config: Config, owner: &str, issuer: Option<&str>) -> ExitCode {
    // The owner is checked where the API's is (`Gateway::issue_enrolment_code`): an invalid one is
    // refused there, before anything is stored.
    let issuer = issuer.map_or_else(|| default_issuer(&config), str::to_string);
    let login = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    let issued_by = format!("cli:{login}");
    let owner = owner.to_string();
    super::one_shot(config, |g| async move {
        match g.issue_enrolment_code(&issuer, &owner, &issued_by, "cli").await {
            Ok(issued) => {
                println!("{}", issued.code);
                eprintln!(
                    "enrolment code for {} (issuer {}), single use, until {}: give it to them out of band; \
                     they enter it with their first passkey in the console",
                    issued.owner, issued.issuer, issued.expires_at
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                crate::logging::fatal(&e.message);
                if e.is_invalid_argument() { ExitCode::from(2) } else { ExitCode::FAILURE }
            }
        }
    })
}
