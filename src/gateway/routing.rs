//! One tool for any rail (`request_payment`, `send_payment`): the rail is the one the agent names,
//! or the one whose operator serves the phone number — by its prefix, from each rail's configured
//! table (`mpesa.prefixes`, `airtel.prefixes`), longest prefix first. The routed call then is the
//! rail's own tool in every respect (operation_id space, policy, limits, approvals, audit), so one
//! operation_id is one payment whichever name the agent used; and the rails' tools for one flow
//! share one more key ([`operation_family`]), so it is one payment whichever rail a retry names.

use super::{Caller, Gateway};
use crate::error::AgentError;

/// What a routed tool asks the rail for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// A collection prompt on the payer's phone.
    Collection,
    /// A payout to the payee's phone.
    Payout,
}

/// Subscriber-number prefixes (the digits after `0` or `254`) and the rail whose operator owns them.
#[derive(Debug, Clone, Default)]
pub struct PhoneRoutes {
    /// (prefix, rail name), longest prefix first.
    routes: Vec<(String, String)>,
}

impl PhoneRoutes {
    /// From each enabled rail's table. Config validation has checked the prefixes (digits, bounded,
    /// no prefix in two rails).
    pub fn new<'a>(tables: impl IntoIterator<Item = (&'a str, &'a [String])>) -> Self {
        let mut routes: Vec<(String, String)> = tables
            .into_iter()
            .flat_map(|(rail, prefixes)| prefixes.iter().map(move |p| (p.clone(), rail.to_string())))
            .collect();
        routes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        PhoneRoutes { routes }
    }

    /// The rail serving this 9-digit subscriber number, by its longest matching prefix.
    pub fn rail_for(&self, subscriber: &str) -> Option<&str> {
        self.routes.iter().find(|(p, _)| subscriber.starts_with(p.as_str())).map(|(_, rail)| rail.as_str())
    }
}

/// The tool of `rail` that does what a routed tool asks: the call runs as that tool.
pub fn rail_tool(rail: &str, what: Routed) -> Option<&'static str> {
    match (rail, what) {
        ("mpesa", Routed::Collection) => Some("request_mpesa_payment"),
        ("airtel", Routed::Collection) => Some("request_airtel_payment"),
        ("mpesa", Routed::Payout) => Some("send_mpesa_payout"),
        ("airtel", Routed::Payout) => Some("send_airtel_payout"),
        _ => None,
    }
}

/// The operation_id space a rail tool shares with the other rails' tool for the same flow: one
/// operation_id is one payout (one collection) whichever rail or tool name carried it. The key
/// of this name is taken first ([`super::keys::Idem::family`]); its fingerprint names the rail's
/// tool, so the same operation_id on a second rail is `IDEMPOTENCY_CONFLICT` and moves nothing.
/// Family names are no tool's name.
pub fn operation_family(tool: &str) -> Option<&'static str> {
    match crate::catalogue::canonical(tool) {
        "send_mpesa_payout" | "send_airtel_payout" => Some("rails/payout"),
        "request_mpesa_payment" | "request_airtel_payment" => Some("rails/collection"),
        _ => None,
    }
}

/// The rail tools of a family ([`operation_family`]).
pub fn family_tools(family: &str) -> &'static [&'static str] {
    match family {
        "rails/payout" => &["send_mpesa_payout", "send_airtel_payout"],
        "rails/collection" => &["request_mpesa_payment", "request_airtel_payment"],
        _ => &[],
    }
}

impl Gateway {
    /// Chooses the rail and the rail's tool for a routed call (`tool`: the name the agent called):
    /// `rail` if the agent named one, else the operator of `phone`. A refusal (the tool disabled,
    /// no such rail, a number no enabled rail serves) is admitted first (scope, rate limits: a
    /// routing refusal is no free call), then audited under `tool`; it moves nothing.
    pub async fn route(
        &self,
        caller: &Caller,
        tool: &str,
        what: Routed,
        phone: &str,
        rail: Option<&str>,
    ) -> Result<(&'static str, &'static str), AgentError> {
        match self.choose_rail(caller, tool, what, phone, rail) {
            Ok(routed) => Ok(routed),
            Err(e) => {
                self.admit(caller, tool).await?;
                Err(self.refuse(caller, tool, None, e).await)
            }
        }
    }

    /// [`Gateway::route`]'s choice, unaudited (a preflight asks it).
    pub fn choose_rail(
        &self,
        caller: &Caller,
        tool: &str,
        what: Routed,
        phone: &str,
        rail: Option<&str>,
    ) -> Result<(&'static str, &'static str), AgentError> {
        let policy = &caller.principal.policy;
        let canonical = crate::catalogue::canonical(tool);
        if policy.is_disabled(tool) || policy.is_disabled(canonical) {
            return Err(AgentError::invalid(format!("{tool} is disabled by policy (version {})", policy.version)));
        }
        let enabled = || self.rails.iter().map(|r| r.name()).collect::<Vec<_>>().join(", ");
        let name = match rail {
            Some(name) => name.to_string(),
            None => {
                let expected = "expected a Kenyan mobile number such as 0712345678 or 254712345678";
                let subscriber = crate::backend::kenya::subscriber(phone, expected)
                    .map_err(|why| AgentError::invalid(format!("phone_number: {why}")))?;
                self.routes.rail_for(&subscriber).map(str::to_string).ok_or_else(|| {
                    AgentError::invalid(format!(
                        "phone_number: no enabled rail serves numbers starting 0{}; name one in `rail` ({})",
                        &subscriber[..subscriber.len().min(3)],
                        enabled()
                    ))
                })?
            }
        };
        let Some(found) = self.rail(&name) else {
            return Err(AgentError::invalid(format!("rail: {name:?} is not enabled on this gateway ({})", enabled())));
        };
        let offered = match what {
            Routed::Collection => found.offers(crate::domain::rail::RailFlow::Collection),
            Routed::Payout => found.offers(crate::domain::rail::RailFlow::Payout),
        };
        match rail_tool(found.name(), what).filter(|_| offered) {
            Some(rail_tool) => Ok((found.name(), rail_tool)),
            None => {
                let flow = if what == Routed::Payout { "payouts" } else { "collections" };
                Err(AgentError::invalid(format!(
                    "{flow} through {} are not offered on this gateway",
                    found.display_name()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_longest_prefix_chooses_the_rail() {
        let (mpesa, airtel) = (strings(&["7", "757", "11"]), strings(&["75", "73", "10"]));
        let routes = PhoneRoutes::new([("mpesa", mpesa.as_slice()), ("airtel", airtel.as_slice())]);
        for (subscriber, rail) in [
            ("712345678", Some("mpesa")),
            ("733123456", Some("airtel")),
            ("750123456", Some("airtel")),
            ("757123456", Some("mpesa")),
            ("110123456", Some("mpesa")),
            ("100123456", Some("airtel")),
            ("120123456", None),
        ] {
            assert_eq!(routes.rail_for(subscriber), rail, "{subscriber}");
        }
        assert_eq!(PhoneRoutes::default().rail_for("712345678"), None);
        assert_eq!(rail_tool("mpesa", Routed::Payout), Some("send_mpesa_payout"));
        assert_eq!(rail_tool("airtel", Routed::Payout), Some("send_airtel_payout"));
        assert_eq!(rail_tool("external", Routed::Payout), None);
        assert_eq!(rail_tool("airtel", Routed::Collection), Some("request_airtel_payment"));
    }
}
