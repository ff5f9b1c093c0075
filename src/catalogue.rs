//! The tool catalogue: every MCP tool's name, the scope it needs, whether it moves money, and the
//! hints clients show. One table, read by `mcp` (tools/list annotations), the HTTP auth layer (the 403
//! challenge's scope), `policy` (money tools) and `config` (tool names in `tools.*` and profiles).
//!
//! Architecture Invariant: a tool that is not in this table cannot be called (the auth layer finds
//! no scope for it and refuses), and `mcp`'s own tests fail if its router and this table disagree.

/// OAuth scopes: what agents' and operators' tokens carry.
pub mod scopes {
    pub const READ: &str = "payments:read";
    pub const CREATE: &str = "payments:create";
    pub const REFUND: &str = "payments:refund";
    pub const COLLECT: &str = "payments:collect";
    /// Money out to a customer through a rail (an M-Pesa B2C payout).
    pub const PAYOUT: &str = "payments:payout";
    pub const ADMIN: &str = "payments:admin";
    pub const APPROVE: &str = "payments:approve";
    pub const AUDIT: &str = "payments:audit";
    /// Every scope an agent token can carry, for the RFC 9728 document.
    pub const AGENT_SCOPES: &[&str] = &[READ, CREATE, REFUND, COLLECT, PAYOUT, ADMIN];
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
        scope: scopes::ADMIN,
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
        name: "send_mpesa_payout",
        title: "Send M-Pesa payout",
        scope: scopes::PAYOUT,
        effect: Effect::MovesMoney { destructive: true },
        open_world: true,
    },
    read("get_payment_summary", "Payment summary"),
    ToolSpec { name: "reconcile", title: "Reconcile", scope: scopes::ADMIN, effect: Effect::Settles, open_world: true },
];

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

pub fn tool(name: &str) -> Option<&'static ToolSpec> {
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
        }
        let money: Vec<_> = TOOLS.iter().filter(|t| t.moves_money()).map(|t| t.name).collect();
        assert_eq!(money, ["create_payment", "refund_payment", "request_mpesa_payment", "send_mpesa_payout"]);
        assert_eq!(scope_for_tool("refund_payment"), Some(scopes::REFUND));
        assert_eq!(scope_for_tool("no_such_tool"), None);
    }
}
