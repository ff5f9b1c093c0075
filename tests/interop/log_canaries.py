#!/usr/bin/env python3
"""Put what must never be logged into paygate's path, through the official Python MCP SDK, so the
log check at the end of run.sh has something to find if redaction fails: phone numbers in every
form the rails accept (as a collection's phone and inside a payment memo) and a memo that is tool
arguments only (it must not appear in a debug log at all).

    .venv/bin/python log_canaries.py --url URL --token TOKEN --op-prefix P --memo-canary TEXT

Prints `ok <step>` lines; exits 0 when the calls were answered (refusals included).
"""

from __future__ import annotations

import argparse
import sys

import anyio
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

PHONES = ("0712345678", "254712345678", "+254 712 345 678", "712345678")


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--op-prefix", required=True)
    p.add_argument("--memo-canary", required=True)
    args = p.parse_args()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {args.token}"}, timeout=httpx2.Timeout(30.0))
    async with http:
        async with Client(streamable_http_client(args.url, http_client=http), mode="auto", cache=None) as client:
            for i, phone in enumerate(PHONES):
                # A collection: paygate has no M-Pesa rail here, so it is refused, but the arguments
                # (the phone) still cross every layer that could log them.
                try:
                    await client.call_tool(
                        "request_mpesa_payment",
                        {"operation_id": f"{args.op_prefix}-stk-{i}", "phone_number": phone, "amount": "10"},
                    )
                except Exception:  # noqa: BLE001 - an unknown tool is an error; the call was made
                    pass
                print(f"ok   collection with phone form {i}")
            res = await client.call_tool(
                "create_payment",
                {
                    "operation_id": f"{args.op_prefix}-memo",
                    "from_account": "acct-A",
                    "to_account": "acct-B",
                    "amount": "1.00",
                    "currency": "KES",
                    "memo": f"{args.memo_canary} call 0712345678 or +254712345678",
                },
            )
            if res.is_error:
                print(f"FAIL payment with a phone in its memo: {res}")
                return 1
            print("ok   payment with a phone in its memo")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
