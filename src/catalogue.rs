//! The tool catalogue: every MCP tool's name, the scope it needs, whether it moves money, and the
//! hints clients show. One table, read by `mcp` (tools/list annotations), the HTTP auth layer (the 403
//! challenge's scope), `policy` (money tools) and `config` (tool names in `tools.*` and profiles).
//!
//! Architecture Invariant: a tool that is not in this table cannot be called (the auth layer finds
//! no scope for it and refuses), and `mcp`'s own tests fail if its router and this table disagree.
//!
//! Aliases (`ALIASES`) are second names for a catalogued tool, for operators used to another
//! server's names. An alias is not a tool of its own: every lookup here answers for its canonical
//! tool, and the gateway admits, rate-limits, audits and keys it under the canonical name, so
//! alternating names gains nothing. Disabling the canonical tool disables its aliases too.

/// OAuth scopes: what agents' and operators' tokens carry. The two sets share no name: an agent's
/// scopes mean something only at the MCP resource, an operator's only at the operator resource, and
/// each resource accepts only tokens whose audience is itself (`auth::Audience`).
pub mod scopes {
    // Agent scopes: tokens for the MCP resource (`<public_url>/mcp`).
    pub const READ: &str = "payments:read";
    pub const CREATE: &str = "payments:create";
    pub const REFUND: &str = "payments:refund";
    pub const COLLECT: &str = "payments:collect";
    /// Money out to a customer or a business through a rail (M-Pesa B2C and B2B).
    pub const PAYOUT: &str = "payments:payout";
    /// The agent-side admin tools: `check_ledger_integrity` and `reconcile`. (Before agents and
    /// operators were told apart this was `payments:admin`; see `LEGACY_AGENT_ADMIN`.)
    pub const INTEGRITY: &str = "payments:integrity";

    // Operator scopes: tokens for the operator resource (`<public_url>/operator`).
    pub const APPROVE: &str = "payments:approve";
    pub const AUDIT: &str = "payments:audit";
    /// Suspend and resume agents, run reconciliation from the operator API.
    pub const ADMIN: &str = "payments:admin";
    /// A person confirming their own payments (the user-approval tier): given to the console's
    /// sign-in, never to an agent. /mcp refuses a token that carries it.
    pub const CONFIRM: &str = "payments:confirm";

    /// The name the agent-side admin scope had before it became `payments:integrity`. On an agent
    /// token it means nothing unless `auth.legacy_agent_admin_scope` is set (a migration switch for
    /// identity providers not yet updated), and then it reads as `payments:integrity`.
    pub const LEGACY_AGENT_ADMIN: &str = ADMIN;

    /// Every scope an agent token can carry, for the MCP resource's RFC 9728 document.
    pub const AGENT_SCOPES: &[&str] = &[READ, CREATE, REFUND, COLLECT, PAYOUT, INTEGRITY];
    /// Every scope an operator token can carry, for the operator resource's RFC 9728 document.
    pub const OPERATOR_SCOPES: &[&str] = &[AUDIT, APPROVE, ADMIN, CONFIRM];
}

/// What kind of effect a tool has; the MCP hints follow from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads only.
    Read,
    /// Moves money, exactly once per operation_id (governed by budgets, stop rules, approvals).
    MovesMoney { destructive: bool },
    /// Changes the gateway's own records, idempotently (reconciliation settling unknowns).
    Settles,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: &'static str,
    /// Shown by clients.
    pub title: &'static str,
    pub scope: &'static str,
    pub effect: Effect,
    /// Talks to systems outside the gateway's own ledger (a rail, an external backend).
    pub open_world: bool,
}

impl ToolSpec {
    pub fn moves_money(&self) -> bool {
        matches!(self.effect, Effect::MovesMoney { .. })
    }
}

const fn read(name: &'static str, title: &'static str) -> ToolSpec {
    ToolSpec { name, title, scope: scopes::READ, effect: Effect::Read, open_world: false }
}

pub const TOOLS: &[ToolSpec] = &[
    read("get_balance", "Get balance"),
    read("get_payment", "Get payment"),
    read("list_payments", "List payments"),
    read("get_account_ledger", "Account ledger"),
    ToolSpec {
        name: "create_payment",
        title: "Create payment",
        scope: scopes::CREATE,
        effect: Effect::MovesMoney { destructive: false },
        open_world: false,
    },
    ToolSpec {
        name: "refund_payment",
        title: "Refund payment",
        scope: scopes::REFUND,
        effect: Effect::MovesMoney { destructive: true },
        open_world: false,
    },
    read("get_approval", "Get approval"),
    ToolSpec {
        name: "check_ledger_integrity",
        title: "Check ledger integrity",
        scope: scopes::INTEGRITY,
        effect: Effect::Read,
        open_world: false,
    },
    ToolSpec {
        name: "request_mpesa_payment",
        title: "Request M-Pesa payment",
        scope: scopes::COLLECT,
        effect: Effect::MovesMoney { destructive: false },
        open_world: true,
    },
    ToolSpec {
        name: "request_airtel_payment",
        title: "Request Airtel Money payment",
        scope: scopes::COLLECT,
        effect: Effect::MovesMoney { destructive: false },
        open_world: true,
    },
    ToolSpec {
        name: "send_mpesa_payout",
        title: "Send M-Pesa payout",
        scope: scopes::PAYOUT,
        effect: Effect::MovesMoney { destructive: true },
        open_world: true,
    },
    ToolSpec {
        name: "send_airtel_payout",
        title: "Send Airtel Money payout",
        scope: scopes::PAYOUT,
        effect: Effect::MovesMoney { destructive: true },
        open_world: true,
    },
    ToolSpec {
        name: "request_payment",
        title: "Request a mobile-money payment",
        scope: scopes::COLLECT,
        effect: Effect::MovesMoney { destructive: false },
        open_world: true,
    },
    ToolSpec {
        name: "send_payment",
        title: "Send a mobile-money payment",
        scope: scopes::PAYOUT,
        effect: Effect::MovesMoney { destructive: true },
        open_world: true,
    },
    ToolSpec {
        name: "pay_paybill",
        title: "Pay an M-Pesa paybill",
        scope: scopes::PAYOUT,
        effect: Effect::MovesMoney { destructive: true },
        open_world: true,
    },
    ToolSpec {
        name: "pay_till",
        title: "Pay an M-Pesa till",
        scope: scopes::PAYOUT,
        effect: Effect::MovesMoney { destructive: true },
        open_world: true,
    },
    read("get_payment_summary", "Payment summary"),
    read("check_transaction_status", "Check transaction status"),
    read("generate_receipt", "Generate receipt"),
    read("get_today_summary", "Today's summary"),
    read("get_today_transactions", "Today's transactions"),
    read("get_failed_transactions", "Failed transactions"),
    read("check_payment_policy", "Check payment policy"),
    ToolSpec {
        name: "reconcile",
        title: "Reconcile",
        scope: scopes::INTEGRITY,
        effect: Effect::Settles,
        open_world: true,
    },
];

/// A second name for a catalogued tool: same arguments, same result, same scope, policy, rate
/// limits, idempotency and audit (all under `canonical`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias {
    pub name: &'static str,
    pub canonical: &'static str,
}

/// The names of the widely used M-Pesa and payments MCP servers.
pub const ALIASES: &[Alias] = &[
    Alias { name: "initiate_stk_push", canonical: "request_mpesa_payment" },
    Alias { name: "pay_to_paybill", canonical: "pay_paybill" },
    Alias { name: "pay_to_mpesa_till", canonical: "pay_till" },
    Alias { name: "initiate_payment", canonical: "request_payment" },
    Alias { name: "check_payment_status", canonical: "check_transaction_status" },
];

/// The rail tools a routing tool runs as (`gateway::routing`), named for an operator; `None` for
/// any other tool.
pub fn routed_to(name: &str) -> Option<&'static str> {
    match name {
        "request_payment" => Some("request_mpesa_payment and request_airtel_payment"),
        "send_payment" => Some("send_mpesa_payout and send_airtel_payout"),
        _ => None,
    }
}

/// The tool a name stands for: the canonical name of an alias, or the name itself.
pub fn canonical(name: &str) -> &str {
    ALIASES.iter().find(|a| a.name == name).map_or(name, |a| a.canonical)
}

/// The alias `name` is, if it is one.
pub fn alias(name: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name)
}

/// The aliases of a canonical tool.
pub fn aliases_of(canonical: &str) -> impl Iterator<Item = &'static str> + '_ {
    ALIASES.iter().filter(move |a| a.canonical == canonical).map(|a| a.name)
}

/// Scope needed to read resources and prompts.
pub const READ_SCOPE: &str = scopes::READ;
/// Names for the non-tool requests the gateway admits (scope and rate limit) like tools.
pub const RESOURCES_READ: &str = "resources/read";
pub const PROMPTS_GET: &str = "prompts/get";

/// The scope a request needs: a tool's, or read for resources and prompts; `None` for no such
/// request (refused: fail closed).
pub fn scope_for_request(name: &str) -> Option<&'static str> {
    match name {
        RESOURCES_READ | PROMPTS_GET => Some(READ_SCOPE),
        tool => scope_for_tool(tool),
    }
}

/// A tool's spec, by its name or an alias's (an alias answers with its canonical tool's spec).
pub fn tool(name: &str) -> Option<&'static ToolSpec> {
    let name = canonical(name);
    TOOLS.iter().find(|t| t.name == name)
}

pub fn scope_for_tool(name: &str) -> Option<&'static str> {
    tool(name).map(|t| t.scope)
}

pub fn moves_money(name: &str) -> bool {
    tool(name).is_some_and(ToolSpec::moves_money)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_money_tools_need_a_money_scope() {
        let mut names: Vec<_> = TOOLS.iter().map(|t| t.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TOOLS.len(), "duplicate tool names");
        for t in TOOLS {
            if t.moves_money() {
                assert!([scopes::CREATE, scopes::REFUND, scopes::COLLECT, scopes::PAYOUT].contains(&t.scope), "{t:?}");
            }
            assert!(scopes::AGENT_SCOPES.contains(&t.scope), "{t:?} needs a scope agents can hold");
            assert!(!scopes::OPERATOR_SCOPES.contains(&t.scope), "{t:?}: no tool takes an operator scope");
        }
        for s in scopes::AGENT_SCOPES {
            assert!(!scopes::OPERATOR_SCOPES.contains(s), "{s} is both an agent and an operator scope");
        }
        let money: Vec<_> = TOOLS.iter().filter(|t| t.moves_money()).map(|t| t.name).collect();
        assert_eq!(
            money,
            [
                "create_payment",
                "refund_payment",
                "request_mpesa_payment",
                "request_airtel_payment",
                "send_mpesa_payout",
                "send_airtel_payout",
                "request_payment",
                "send_payment",
                "pay_paybill",
                "pay_till"
            ]
        );
        assert_eq!(scope_for_tool("refund_payment"), Some(scopes::REFUND));
        assert_eq!(scope_for_tool("request_airtel_payment"), Some(scopes::COLLECT));
        assert_eq!(scope_for_tool("no_such_tool"), None);
    }

    #[test]
    fn aliases_answer_for_their_canonical_tool_and_never_shadow_one() {
        for a in ALIASES {
            assert!(TOOLS.iter().all(|t| t.name != a.name), "alias {} shadows a tool", a.name);
            let spec = tool(a.canonical).unwrap_or_else(|| panic!("{} aliases no tool", a.name));
            assert_eq!(tool(a.name), Some(spec), "{}", a.name);
            assert_eq!(canonical(a.name), a.canonical);
            assert!(aliases_of(a.canonical).any(|n| n == a.name));
            assert!(alias(a.canonical).is_none(), "{} is an alias of an alias", a.canonical);
        }
        assert_eq!(canonical("initiate_stk_push"), "request_mpesa_payment");
        assert_eq!(scope_for_tool("initiate_stk_push"), Some(scopes::COLLECT));
        assert!(moves_money("initiate_stk_push"), "an alias of a money tool is a money tool");
        assert_eq!(canonical("get_payment"), "get_payment");
        assert_eq!((canonical("pay_to_paybill"), canonical("pay_to_mpesa_till")), ("pay_paybill", "pay_till"));
        assert_eq!(scope_for_tool("pay_to_mpesa_till"), Some(scopes::PAYOUT));
    }
}
