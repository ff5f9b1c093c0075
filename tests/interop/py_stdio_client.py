#!/usr/bin/env python3
"""Interop: `paygate stdio` started and driven by the official Python MCP SDK's stdio client.

Usage (with the pinned venv; the gateway's config is this process's PAYGATE_* environment):

    PAYGATE_STORAGE__DATA_DIR=... PAYGATE_SERVER__PUBLIC_URL=... \\
    tests/interop/.venv/bin/python tests/interop/py_stdio_client.py \\
        --bin target/debug/paygate --token "$TOKEN" --era legacy|modern --op-prefix PREFIX \\
        [--server-log FILE]

The SDK spawns the server itself, as a desktop client does: StdioServerParameters(command=--bin,
args=["stdio"], env={PAYGATE_TOKEN, and every PAYGATE_* variable of this process}). The SDK passes
only that env (over a few safe defaults such as PATH), so nothing else reaches the server.

Steps: the handshake (legacy: initialize; modern: server/discover, 2026-07-28), tools, get_balance,
create_payment, the same operation_id again (replayed, same payment id, the balance moved once),
an over-limit payment (APPROVAL_REQUIRED as a tool error), and a start with no token, which must
fail before any MCP exchange.

Prints one line per step (`ok   <step>` / `FAIL <step>: <why>`) and exits 0 only if every step passed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from decimal import Decimal
from typing import Any, TextIO

import anyio
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

MODERN_VERSION = "2026-07-28"


class StepFailed(Exception):
    pass


def check(cond: bool, why: str) -> None:
    if not cond:
        raise StepFailed(why)


def describe(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


def params(args: argparse.Namespace, token: str | None) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k.startswith("PAYGATE_")}
    env.pop("PAYGATE_TOKEN", None)
    if token is not None:
        env["PAYGATE_TOKEN"] = token
    return StdioServerParameters(command=args.bin, args=["stdio"], env=env)


def pay_args(op: str, amount: str) -> dict[str, Any]:
    return {"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"}


async def run(args: argparse.Namespace, errlog: TextIO) -> bool:
    all_ok = True

    def report(step: str, ok: bool, why: str = "") -> None:
        nonlocal all_ok
        all_ok = all_ok and ok
        print(f"ok   {step}" if ok else f"FAIL {step}: {why}", flush=True)

    mode = "legacy" if args.era == "legacy" else "auto"
    try:
        client_cm = Client(stdio_client(params(args, args.token), errlog=errlog), mode=mode, cache=None)
        client = await client_cm.__aenter__()
    except BaseException as e:  # noqa: BLE001 - report, then fail the run
        report("connect", False, describe(e))
        return False

    try:
        session = client.session
        try:
            if args.era == "legacy":
                check(session.initialize_result is not None, "legacy connect did not run initialize")
            else:
                check(client.protocol_version == MODERN_VERSION, f"negotiated {client.protocol_version!r}")
                check(session.discover_result is not None, "no server/discover result was adopted")
            report("handshake", True)
        except StepFailed as e:
            report("handshake", False, str(e))

        async def step(name: str, fn: Any) -> None:
            try:
                await fn()
                report(name, True)
            except StepFailed as e:
                report(name, False, str(e))
            except Exception as e:  # protocol, validation and transport errors
                report(name, False, describe(e))

        state: dict[str, Any] = {}

        async def balance() -> Decimal:
            res = await client.call_tool("get_balance", {"account_id": "acct-A"})
            check(not res.is_error, f"get_balance isError: {res.structured_content}")
            sc = res.structured_content
            check(isinstance(sc, dict) and sc.get("currency") == "KES", f"not a KES balance: {sc}")
            return Decimal(sc["balance"])

        async def list_tools() -> None:
            names = [t.name for t in (await client.list_tools()).tools]
            check("create_payment" in names and "get_balance" in names, f"tools: {names}")

        async def get_balance() -> None:
            state["before"] = await balance()

        async def create_payment() -> None:
            res = await client.call_tool("create_payment", pay_args(f"{args.op_prefix}-pay", "1.50"))
            sc = res.structured_content
            check(not res.is_error and isinstance(sc, dict), f"isError: {sc}")
            check(sc.get("replayed") is False, f"replayed is {sc.get('replayed')!r}, want false: {sc}")
            check(sc.get("status") == "succeeded", f"status {sc.get('status')!r}: {sc}")
            check(sc.get("amount") == "1.50", f"amount {sc.get('amount')!r}: {sc}")
            state["id"] = sc.get("payment_id")
            check(bool(state["id"]), f"no payment_id: {sc}")

        async def create_payment_replay() -> None:
            res = await client.call_tool("create_payment", pay_args(f"{args.op_prefix}-pay", "1.50"))
            sc = res.structured_content
            check(not res.is_error and isinstance(sc, dict), f"isError: {sc}")
            check(sc.get("replayed") is True, f"replayed is {sc.get('replayed')!r}, want true: {sc}")
            check(sc.get("payment_id") == state.get("id"), f"payment_id {sc.get('payment_id')!r} != {state.get('id')!r}")

        async def moved_once() -> None:
            after = await balance()
            check(after == state["before"] - Decimal("1.50"), f"acct-A went {state['before']} → {after}, want -1.50 once")

        async def over_limit() -> None:
            res = await client.call_tool("create_payment", pay_args(f"{args.op_prefix}-big", "5000.00"))
            sc = res.structured_content
            code = (sc or {}).get("error", {}).get("code") if isinstance(sc, dict) else None
            check(res.is_error is True and code == "APPROVAL_REQUIRED", f"want APPROVAL_REQUIRED, got {sc}")

        await step("list_tools", list_tools)
        await step("get_balance", get_balance)
        await step("create_payment", create_payment)
        await step("create_payment_replay", create_payment_replay)
        if "before" in state:
            await step("balance_moved_once", moved_once)
        await step("over_limit", over_limit)
    finally:
        try:
            await client_cm.__aexit__(None, None, None)
        except BaseException as e:  # noqa: BLE001
            report("disconnect", False, describe(e))

    # No token: the server says why on stderr and exits before any MCP exchange, so the SDK's
    # handshake cannot complete.
    try:
        with anyio.fail_after(30):
            async with Client(stdio_client(params(args, None), errlog=errlog), mode=mode, cache=None):
                pass
        report("no_token_refused", False, "the SDK connected to paygate stdio without a token")
    except TimeoutError:
        report("no_token_refused", False, "neither refused nor connected within 30 s")
    except BaseException as e:  # noqa: BLE001 - the expected outcome: the connection failed
        report("no_token_refused", True)
        print(f"info no-token connect failed as it must: {describe(e)}", flush=True)
    return all_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the paygate binary")
    ap.add_argument("--token", required=True, help="an agent token for <public_url>/mcp")
    ap.add_argument("--era", choices=["legacy", "modern"], default="legacy")
    ap.add_argument("--op-prefix", required=True, help="prefix for operation_ids (unique per run)")
    ap.add_argument("--server-log", help="append paygate's stderr here (default: this stderr)")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        errlog = stack.enter_context(open(args.server_log, "a")) if args.server_log else sys.stderr
        return 0 if anyio.run(run, args, errlog) else 1


if __name__ == "__main__":
    sys.exit(main())
