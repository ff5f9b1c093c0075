#!/usr/bin/env python3
"""Interop client for paygate built on the official Python MCP SDK (mcp 2.x).

Usage (with the pinned venv):

    tests/interop/.venv/bin/python tests/interop/py_client.py \
        --url http://127.0.0.1:8080/mcp --token "$TOKEN" --era legacy|modern --op-prefix PREFIX

Eras:
  legacy  Client(mode="legacy"): the 2025-era initialize / Mcp-Session-Id handshake.
  modern  Client(mode="auto"):   the SDK probes `server/discover` and adopts 2026-07-28
          (stateless, no initialize). The script fails if the SDK fell back to initialize,
          if the negotiated version is not 2026-07-28, or if any HTTP exchange carried an
          Mcp-Session-Id header or an `initialize` request.

Scenarios (--scenario, default `basic`):
  basic            tools, resources, a payment and its replay, the over-limit APPROVAL_REQUIRED.
  url-elicitation  the client declares URL-mode elicitation (the SDK declares form and url as soon as
                   an elicitation_callback is given) and asks for an over-limit payment. modern: an
                   `input_required` result sending the user to the approval page, with a
                   requestState; legacy: the -32042 error naming the page. An operator approves it
                   over HTTP (--approve-token: another subject, scope payments:approve); then the
                   retry pays (modern: same call + request_state + input_responses; legacy: the plain
                   retry, after notifications/elicitation/complete) and a further retry replays it.
                   Rounds are driven by hand (session.call_tool(..., allow_input_required=True)): the
                   SDK's automatic loop would give up long before a person approves.

Prints one line per step (`ok   <step>` / `FAIL <step>: <why>`) and exits 0 only if
every step passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any

import anyio
import httpx2
from mcp import types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError

MODERN_VERSION = "2026-07-28"
EXPECTED_TOOLS = ("create_payment", "get_balance", "get_approval")
EXPECTED_TOOL_COUNT = 17


class StepFailed(Exception):
    pass


def check(cond: bool, why: str) -> None:
    if not cond:
        raise StepFailed(why)


def dump(obj: Any) -> str:
    """Compact JSON rendering of an SDK model (wire field names) for failure messages."""
    try:
        if hasattr(obj, "model_dump"):
            obj = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
        return json.dumps(obj, sort_keys=True)[:1500]
    except Exception:  # pragma: no cover - diagnostics only
        return repr(obj)[:1500]


def describe(e: BaseException) -> str:
    """Name the underlying error, unwrapping anyio/asyncio exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    code = getattr(getattr(e, "error", None), "code", None)
    suffix = f" (code {code})" if code is not None else ""
    return f"{type(e).__name__}{suffix}: {e}"


class WireLog:
    """httpx2 event hooks recording what actually crossed the wire."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.session_ids: set[str] = set()
        self.protocol_headers: set[str] = set()
        # (method, declared elicitation.url) for each initialize / tools/call sent.
        self.declared_url_elicitation: list[tuple[str, bool]] = []
        # Set once the legacy session's standalone GET (SSE) stream has been answered: the
        # channel notifications/elicitation/complete arrives on.
        self.get_stream_open = anyio.Event()

    async def on_request(self, request: httpx2.Request) -> None:
        if sid := request.headers.get("mcp-session-id"):
            self.session_ids.add(sid)
        if pv := request.headers.get("mcp-protocol-version"):
            self.protocol_headers.add(pv)
        if request.method == "POST":
            try:
                body = json.loads(request.content or b"null")
            except Exception:
                body = None
            for msg in body if isinstance(body, list) else [body]:
                if isinstance(msg, dict) and isinstance(msg.get("method"), str):
                    self.methods.append(msg["method"])
                    # Where URL elicitation is declared: initialize (2025-11-25), or each
                    # request's _meta (2026-07-28).
                    params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
                    if msg["method"] == "initialize":
                        caps = params.get("capabilities")
                    elif msg["method"] == "tools/call":
                        caps = (params.get("_meta") or {}).get("io.modelcontextprotocol/clientCapabilities")
                    else:
                        continue
                    elicitation = caps.get("elicitation") if isinstance(caps, dict) else None
                    declared = isinstance(elicitation, dict) and "url" in elicitation
                    self.declared_url_elicitation.append((msg["method"], declared))

    async def on_response(self, response: httpx2.Response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            self.session_ids.add(sid)
        if response.request.method == "GET" and response.status_code == 200:
            self.get_stream_open.set()


class Completions:
    """notifications/elicitation/complete as they arrive (2025-11-25 sessions)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.arrived = anyio.Event()

    async def message_handler(self, message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            self.ids.append(message.params.elicitation_id)
            self.arrived.set()

    async def elicitation_callback(self, context: Any, params: types.ElicitRequestParams) -> Any:
        # Rounds are driven by hand: the server must never send a live elicitation/create here.
        return types.ErrorData(code=types.INVALID_REQUEST, message="this test client drives elicitation by hand")


async def run(args: argparse.Namespace) -> bool:
    all_ok = True

    def report(step: str, ok: bool, why: str = "") -> None:
        nonlocal all_ok
        all_ok = all_ok and ok
        print(f"ok   {step}" if ok else f"FAIL {step}: {why}", flush=True)

    wire = WireLog()
    http_client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {args.token}"},
        timeout=httpx2.Timeout(30.0, read=60.0),
        event_hooks={"request": [wire.on_request], "response": [wire.on_response]},
    )
    mode = "legacy" if args.era == "legacy" else "auto"
    url_elicitation = args.scenario == "url-elicitation"
    completions = Completions()

    async with http_client:
        # Connecting performs the handshake (initialize or server/discover).
        try:
            client_cm = Client(
                streamable_http_client(args.url, http_client=http_client),
                mode=mode,
                cache=None,  # no response caching: every step must reach the server
                elicitation_callback=completions.elicitation_callback if url_elicitation else None,
                message_handler=completions.message_handler if url_elicitation else None,
            )
            client = await client_cm.__aenter__()
        except BaseException as e:  # noqa: BLE001 - report, then fail the run
            report("connect", False, describe(e))
            traceback.print_exc(file=sys.stderr)
            return False

        try:
            session = client.session
            version = client.protocol_version
            via = "initialize" if session.initialize_result is not None else (
                "server/discover" if session.discover_result is not None else "adopt"
            )
            print(f"info era={args.era} sdk_mode={mode} negotiated_protocol_version={version} handshake={via}")
            try:
                if args.era == "legacy":
                    check(session.initialize_result is not None, "legacy connect did not run initialize")
                    check(version != MODERN_VERSION, f"legacy connect negotiated {version}")
                    check("initialize" in wire.methods, f"no initialize request on the wire: {wire.methods}")
                    check(bool(wire.session_ids), "server issued no Mcp-Session-Id on the legacy handshake")
                else:
                    check(version == MODERN_VERSION, f"negotiated {version!r}, want {MODERN_VERSION}")
                    check(session.discover_result is not None, "no server/discover result was adopted")
                    check(session.initialize_result is None, "SDK fell back to initialize")
                    check("server/discover" in wire.methods, f"no server/discover on the wire: {wire.methods}")
                report("handshake", True)
            except StepFailed as e:
                report("handshake", False, str(e))

            if url_elicitation:
                await run_url_elicitation(client, args, report, wire, completions)
            else:
                await run_steps(client, args, report)

            print(
                f"info wire methods={sorted(set(wire.methods))} session_ids_seen={len(wire.session_ids)} "
                f"protocol_version_headers={sorted(wire.protocol_headers)}",
                flush=True,
            )
            if args.era == "modern":
                try:
                    check("initialize" not in wire.methods, f"initialize was sent: {wire.methods}")
                    check(not wire.session_ids, f"Mcp-Session-Id seen on the wire: {sorted(wire.session_ids)}")
                    check(
                        wire.protocol_headers <= {MODERN_VERSION},
                        f"MCP-Protocol-Version headers sent: {sorted(wire.protocol_headers)}",
                    )
                    report("stateless_wire", True)
                except StepFailed as e:
                    report("stateless_wire", False, str(e))
        finally:
            try:
                await client_cm.__aexit__(None, None, None)
            except BaseException as e:  # noqa: BLE001
                report("disconnect", False, describe(e))
    return all_ok


async def run_steps(client: Client, args: argparse.Namespace, report: Any) -> None:
    async def step(name: str, fn: Any) -> None:
        try:
            await fn()
            report(name, True)
        except StepFailed as e:
            report(name, False, str(e))
        except Exception as e:  # protocol errors, validation errors, transport errors
            report(name, False, describe(e))

    async def list_tools() -> None:
        res = await client.list_tools()
        names = [t.name for t in res.tools]
        missing = [n for n in EXPECTED_TOOLS if n not in names]
        check(not missing, f"missing tools {missing}; got {names}")
        check(len(names) == EXPECTED_TOOL_COUNT, f"expected {EXPECTED_TOOL_COUNT} tools, got {len(names)}: {names}")

    async def read_capabilities() -> None:
        res = await client.read_resource("payments://capabilities")
        check(len(res.contents) >= 1, f"no contents: {dump(res)}")
        text = getattr(res.contents[0], "text", None)
        check(isinstance(text, str), f"first content is not text: {dump(res)}")
        doc = json.loads(text)
        accounts = doc.get("allowed_accounts") if isinstance(doc, dict) else None
        check(isinstance(accounts, list) and "acct-A" in accounts, f"allowed_accounts lacks acct-A: {text[:500]}")

    async def get_balance() -> None:
        res = await client.call_tool("get_balance", {"account_id": "acct-A"})
        check(not res.is_error, f"isError: {dump(res)}")
        sc = res.structured_content
        check(isinstance(sc, dict) and sc.get("currency") == "KES", f"structuredContent.currency != KES: {dump(res)}")

    payment: dict[str, Any] = {}

    def pay_args(op: str, amount: str) -> dict[str, Any]:
        return {
            "operation_id": op,
            "from_account": "acct-A",
            "to_account": "acct-B",
            "amount": amount,
            "currency": "KES",
        }

    async def create_payment() -> None:
        res = await client.call_tool("create_payment", pay_args(f"{args.op_prefix}-pay", "1.00"))
        check(not res.is_error, f"isError: {dump(res)}")
        sc = res.structured_content
        check(isinstance(sc, dict), f"no structuredContent object: {dump(res)}")
        check(sc.get("replayed") is False, f"replayed is {sc.get('replayed')!r}, want false: {dump(res)}")
        check(bool(sc.get("payment_id")), f"no payment_id: {dump(res)}")
        payment["id"] = sc["payment_id"]

    async def create_payment_replay() -> None:
        res = await client.call_tool("create_payment", pay_args(f"{args.op_prefix}-pay", "1.00"))
        check(not res.is_error, f"isError: {dump(res)}")
        sc = res.structured_content
        check(isinstance(sc, dict), f"no structuredContent object: {dump(res)}")
        check(sc.get("replayed") is True, f"replayed is {sc.get('replayed')!r}, want true: {dump(res)}")
        check(
            "id" in payment and sc.get("payment_id") == payment["id"],
            f"payment_id {sc.get('payment_id')!r} != first {payment.get('id')!r}",
        )

    async def over_limit() -> None:
        res = await client.call_tool("create_payment", pay_args(f"{args.op_prefix}-big", "5000.00"))
        check(res.is_error is True, f"isError is not true: {dump(res)}")
        sc = res.structured_content
        code = sc.get("error", {}).get("code") if isinstance(sc, dict) and isinstance(sc.get("error"), dict) else None
        check(code == "APPROVAL_REQUIRED", f"structuredContent.error.code={code!r}: {dump(res)}")
        # The SDK skips output validation for isError results; the error envelope is part of the
        # declared outputSchema (anyOf), so run the SDK's own validator on it explicitly.
        try:
            await client.session.validate_tool_result("create_payment", res)
        except RuntimeError as e:
            raise StepFailed(f"error envelope does not match create_payment outputSchema: {e}") from e

    await step("list_tools", list_tools)
    await step("read_capabilities", read_capabilities)
    await step("get_balance", get_balance)
    await step("create_payment", create_payment)
    await step("create_payment_replay", create_payment_replay)
    await step("over_limit", over_limit)


async def run_url_elicitation(
    client: Client, args: argparse.Namespace, report: Any, wire: WireLog, completions: Completions
) -> None:
    base = args.url.rstrip("/").removesuffix("/mcp")
    session = client.session

    async def step(name: str, fn: Any) -> None:
        try:
            await fn()
            report(name, True)
        except StepFailed as e:
            report(name, False, str(e))
        except Exception as e:  # protocol errors, validation errors, transport errors
            report(name, False, describe(e))

    async def balance_minor(account: str) -> int:
        res = await client.call_tool("get_balance", {"account_id": account})
        sc = res.structured_content
        ok = not res.is_error and isinstance(sc, dict) and isinstance(sc.get("balance"), str)
        check(ok, f"get_balance: {dump(res)}")
        return round(float(sc["balance"]) * 100)

    def approval_page(url: Any) -> str:
        check(isinstance(url, str), f"no url: {url!r}")
        apr = url.rsplit("/", 1)[-1]
        check(apr.startswith("apr_"), f"the url names no approval: {url}")
        check(url == f"{base}/console#approvals/{apr}", f"url {url} is not {base}/console#approvals/{apr}")
        return apr

    def paid(res: Any, replayed: bool) -> str:
        check(isinstance(res, types.CallToolResult), f"not a complete result: {dump(res)}")
        check(not res.is_error, f"isError: {dump(res)}")
        sc = res.structured_content
        check(isinstance(sc, dict), f"no structuredContent object: {dump(res)}")
        check(sc.get("status") == "succeeded", f"status {sc.get('status')!r}, want succeeded: {dump(res)}")
        check(sc.get("replayed") is replayed, f"replayed is {sc.get('replayed')!r}, want {replayed}: {dump(res)}")
        check(isinstance(sc.get("payment_id"), str) and sc["payment_id"], f"no payment_id: {dump(res)}")
        # The mandate it paid under is looked up server-side: no JWS ever reaches the client.
        check("eyJ" not in res.model_dump_json(by_alias=True), f"a JWS in the result: {dump(res)}")
        return sc["payment_id"]

    args_ = {
        "operation_id": f"{args.op_prefix}-approve",
        "from_account": "acct-A",
        "to_account": "acct-B",
        "amount": "5000.00",
        "currency": "KES",
    }
    found: dict[str, Any] = {}

    async def list_tools() -> None:
        names = [t.name for t in (await client.list_tools()).tools]
        check("create_payment" in names, f"no create_payment: {names}")

    async def balance_before() -> None:
        found["before"] = await balance_minor("acct-B")

    async def input_required_approval_page() -> None:
        res = await session.call_tool("create_payment", args_, allow_input_required=True)
        check(isinstance(res, types.InputRequiredResult), f"not input_required: {dump(res)}")
        requests = res.input_requests or {}
        check(list(requests) == ["approval"], f"inputRequests keys {list(requests)}: {dump(res)}")
        req = requests["approval"]
        check(isinstance(req, types.ElicitRequest), f"approval is not elicitation/create: {dump(res)}")
        check(isinstance(req.params, types.ElicitRequestURLParams), f"not url mode: {dump(res)}")
        check("approv" in req.params.message, f"message: {req.params.message!r}")
        apr = approval_page(req.params.url)
        check(isinstance(res.request_state, str) and res.request_state, f"no requestState: {dump(res)}")
        found["apr"], found["state"] = apr, res.request_state

    async def elicitation_error() -> MCPError:
        try:
            res = await session.call_tool("create_payment", args_)
        except MCPError as e:
            return e
        raise StepFailed(f"no error, got a result: {dump(res)}")

    async def url_elicitation_required_error() -> None:
        e = await elicitation_error()
        check(e.code == -32042, f"code {e.code}, want -32042: {e.data!r}")
        typed = UrlElicitationRequiredError.from_error(e.error)
        check(len(typed.elicitations) == 1, f"elicitations: {e.data!r}")
        el = typed.elicitations[0]
        check(el.mode == "url", f"mode {el.mode!r}")
        apr = approval_page(el.url)
        check(el.elicitation_id == apr, f"elicitationId {el.elicitation_id!r} is not the page's approval {apr}")
        envelope = (e.data or {}).get("error") or {}
        check(envelope.get("code") == "APPROVAL_REQUIRED", f"data.error: {envelope!r}")
        found["apr"] = apr

    async def retry_before_approval_same_elicitation() -> None:
        e = await elicitation_error()
        check(e.code == -32042, f"code {e.code}, want -32042")
        ids = [el.elicitation_id for el in UrlElicitationRequiredError.from_error(e.error).elicitations]
        check(ids == [found.get("apr")], f"another elicitation: {ids}")

    async def declares_url_elicitation_on_the_wire() -> None:
        where = "initialize" if args.era == "legacy" else "tools/call"
        seen = [d for m, d in wire.declared_url_elicitation if m == where]
        check(bool(seen) and all(seen), f"{where} without elicitation.url: {wire.declared_url_elicitation}")

    async def nothing_moved_before_approval() -> None:
        check("before" in found, "no balance before")
        now = await balance_minor("acct-B")
        check(now == found["before"], f"acct-B moved by {now - found['before']} minor units before any approval")

    async def get_stream_open() -> None:
        with anyio.move_on_after(10):
            await wire.get_stream_open.wait()
        check(wire.get_stream_open.is_set(), "no GET stream within 10 s")

    async def operator_approves() -> None:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            r = await http.post(
                f"{base}/approvals/{found['apr']}/approve",
                headers={"Authorization": f"Bearer {args.approve_token}"},
                json={"reason": "ok"},
            )
        check(r.status_code == 200, f"POST /approvals/{found['apr']}/approve: HTTP {r.status_code} {r.text[:500]}")
        check(r.json().get("status") == "approved", f"approval status after approve: {r.text[:500]}")

    async def elicitation_complete_notice() -> None:
        with anyio.move_on_after(20):
            while found["apr"] not in completions.ids:
                await completions.arrived.wait()
                completions.arrived = anyio.Event()
        check(
            found["apr"] in completions.ids,
            f"no notifications/elicitation/complete for it within 20 s: {completions.ids}",
        )

    async def retry(replayed: bool, plain: bool = False) -> str:
        if args.era == "modern" and not plain:
            res = await session.call_tool(
                "create_payment",
                args_,
                request_state=found["state"],
                input_responses={"approval": types.ElicitResult(action="accept")},
            )
        else:
            res = await session.call_tool("create_payment", args_)
        return paid(res, replayed)

    async def retry_pays() -> None:
        found["payment_id"] = await retry(False)

    async def retry_again_replays() -> None:
        pid = await retry(True)
        check(pid == found.get("payment_id"), f"payment_id {pid} != first {found.get('payment_id')}")

    async def plain_retry_replays() -> None:
        pid = await retry(True, plain=True)
        check(pid == found.get("payment_id"), f"payment_id {pid} != first {found.get('payment_id')}")

    async def moved_exactly_once() -> None:
        now = await balance_minor("acct-B")
        moved = now - found["before"]
        check(moved == 500_000, f"acct-B moved by {moved} minor units, want 500000 (KES 5000.00 once)")

    await step("list_tools", list_tools)
    await step("balance_before", balance_before)
    if args.era == "modern":
        await step("input_required_approval_page", input_required_approval_page)
    else:
        await step("url_elicitation_required_error", url_elicitation_required_error)
        await step("retry_before_approval_same_elicitation", retry_before_approval_same_elicitation)
    await step("declares_url_elicitation_on_the_wire", declares_url_elicitation_on_the_wire)
    await step("nothing_moved_before_approval", nothing_moved_before_approval)
    if "apr" not in found:
        return
    if args.era == "legacy":
        # The notice goes out on the session's GET stream: make sure it is open first.
        await step("get_stream_open", get_stream_open)
    await step("operator_approves", operator_approves)
    if args.era == "legacy":
        await step("elicitation_complete_notice", elicitation_complete_notice)
    await step("retry_pays", retry_pays)
    await step("retry_again_replays", retry_again_replays)
    if args.era == "modern":
        await step("plain_retry_replays", plain_retry_replays)
    await step("moved_exactly_once", moved_exactly_once)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--era", required=True, choices=["legacy", "modern"])
    parser.add_argument("--op-prefix", required=True)
    parser.add_argument("--scenario", default="basic", choices=["basic", "url-elicitation"])
    parser.add_argument("--approve-token", help="an operator's token (scope payments:approve), for url-elicitation")
    args = parser.parse_args()
    if args.scenario == "url-elicitation" and not args.approve_token:
        parser.error("--scenario url-elicitation needs --approve-token")
    try:
        ok = anyio.run(run, args)
    except BaseException as e:  # noqa: BLE001 - any escape is a failure
        print(f"FAIL run: {describe(e)}", flush=True)
        traceback.print_exc(file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
