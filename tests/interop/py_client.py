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
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

MODERN_VERSION = "2026-07-28"
EXPECTED_TOOLS = ("create_payment", "get_balance", "get_approval")
EXPECTED_TOOL_COUNT = 15


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

    async def on_response(self, response: httpx2.Response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            self.session_ids.add(sid)


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

    async with http_client:
        # Connecting performs the handshake (initialize or server/discover).
        try:
            client_cm = Client(
                streamable_http_client(args.url, http_client=http_client),
                mode=mode,
                cache=None,  # no response caching: every step must reach the server
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--era", required=True, choices=["legacy", "modern"])
    parser.add_argument("--op-prefix", required=True)
    args = parser.parse_args()
    try:
        ok = anyio.run(run, args)
    except BaseException as e:  # noqa: BLE001 - any escape is a failure
        print(f"FAIL run: {describe(e)}", flush=True)
        traceback.print_exc(file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
