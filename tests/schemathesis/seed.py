"""Seed a fresh gateway (or ledger service) with real records, so schemathesis reaches the logic
behind the ids and cursors it cannot invent: payments, a refund, a pending approval, a standing
mandate, and a second page of every list. Prints `export NAME=value` lines for run.sh.

    seed.py operator <base_url> <agent_token> <operator_token>
    seed.py ledger <base_url> <credential>

Standard library only: it runs before (and without) the schemathesis venv.
"""

import json
import sys
import urllib.error
import urllib.parse
import urllib.request


def request(method, url, token, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("authorization", f"Bearer {token}")
    req.add_header("content-type", "application/json")
    req.add_header("accept", "application/json, text/event-stream")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def rpc_result(headers, text):
    """A JSON-RPC answer, as plain JSON or the first `data:` event of an SSE stream."""
    if "text/event-stream" in headers.get("Content-Type", headers.get("content-type", "")):
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                return json.loads(line[5:])
        raise SystemExit(f"seed: no data event in {text!r}")
    return json.loads(text)


def need(ok, what):
    if not ok:
        raise SystemExit(f"seed: {what}")


def operator(base, agent_token, operator_token):
    mcp = f"{base}/mcp"
    status, headers, text = request(
        "POST",
        mcp,
        agent_token,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "seed", "version": "1"}},
        },
    )
    need(status == 200, f"initialize: {status} {text}")
    session = {k.lower(): v for k, v in headers.items()}.get("mcp-session-id")
    need(session, "no mcp-session-id")
    h = {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    request("POST", mcp, agent_token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, h)

    def tool(i, name, arguments):
        status, headers, text = request(
            "POST", mcp, agent_token, {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": arguments}}, h
        )
        need(status == 200, f"{name}: {status} {text}")
        return rpc_result(headers, text)["result"]["structuredContent"]

    pay = lambda i, op, amount: tool(
        i, "create_payment", {"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"}
    )
    first = pay(2, "seed-1", "50.00")
    pay(3, "seed-2", "60.00")
    payment_id = first["payment_id"]
    tool(4, "refund_payment", {"operation_id": "seed-refund-1", "payment_id": payment_id, "amount": "10.00"})
    asked = pay(5, "seed-3", "5000.00")
    approval_id = asked.get("error", {}).get("approval_id")
    need(approval_id, f"no approval asked for: {asked}")

    ops = f"{base}/operator/v1"
    mandates = []
    for budget in ("10000.00", "20000.00"):  # two, for a second page of mandates
        status, _, text = request(
            "POST",
            f"{base}/approvals",
            operator_token,
            {
                "subject": "dev-agent",
                "kind": "open",
                "currency": "KES",
                "payer": "acct-A",
                "payees": ["acct-B"],
                "per_payment_max": "2000.00",
                "budget": budget,
                "max_uses": 10,
                "valid_for_secs": 86400,
            },
        )
        need(status == 201, f"preauthorize: {status} {text}")
        mandates.append(json.loads(text).get("mandate_id"))
        need(mandates[-1], f"no mandate issued: {text}")
    mandate_id = mandates[0]

    def cursor(path):
        status, _, text = request("GET", f"{ops}{path}?limit=1", operator_token)
        need(status == 200, f"GET {path}: {status} {text}")
        c = json.loads(text)["next_cursor"]
        need(c, f"GET {path}: no second page")
        return c

    # A pending policy proposal: raising the dev profile's limit widens, so it waits for a second
    # operator (the {proposal_id} routes need one to exist).
    status, _, text = request("GET", f"{ops}/policy", operator_token)
    need(status == 200, f"GET /policy: {status} {text}")
    document = json.loads(text)["document"]
    for profile in document["policy"]["profiles"]:
        if profile["name"] == "dev":
            profile["autonomous_limit"] = {"KES": "1500.00"}
    status, _, text = request("POST", f"{ops}/policy/proposals", operator_token, {"document": document, "reason": "seed"})
    need(status == 202, f"propose: {status} {text}")
    proposal_id = json.loads(text)["proposal_id"]

    out = {
        "SEED_PROPOSAL_ID": proposal_id,
        "SEED_PAYMENT_ID": payment_id,
        "SEED_APPROVAL_ID": approval_id,
        "SEED_MANDATE_ID": mandate_id,
        "SEED_PAYMENTS_CURSOR": cursor("/payments"),
        "SEED_AUDIT_CURSOR": cursor("/audit"),
        "SEED_APPROVALS_CURSOR": cursor("/approvals"),
        "SEED_MANDATES_CURSOR": cursor("/mandates"),
    }
    return out


def ledger(base, credential):
    def pay(key, payment_id, amount):
        status, _, text = request(
            "POST",
            f"{base}/v1/payments",
            credential,
            {
                "payment_id": payment_id,
                "from_account": "acct-A",
                "to_account": "acct-B",
                "amount_minor": amount,
                "currency": "KES",
                "principal_sub": "seed",
            },
            {"idempotency-key": key},
        )
        need(status == 201, f"ledger payment: {status} {text}")
        return json.loads(text)["id"]

    payment_id = pay("idk_seed_1", "pay_seed1", 5000)
    pay("idk_seed_2", "pay_seed2", 6000)
    status, _, text = request("GET", f"{base}/v1/payments?account=acct-A&limit=1", credential)
    need(status == 200, f"ledger list: {status} {text}")
    before = json.loads(text)["next_cursor"]
    need(before is not None, "ledger list: no second page")
    return {"SEED_PAYMENT_ID": payment_id, "SEED_BEFORE": str(before)}


def main():
    kind, args = sys.argv[1], sys.argv[2:]
    out = operator(*args) if kind == "operator" else ledger(*args)
    for k, v in out.items():
        print(f"export {k}={urllib.parse.quote(str(v), safe='_-.:')}")


if __name__ == "__main__":
    main()
