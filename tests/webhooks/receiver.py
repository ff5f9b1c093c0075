"""A webhook receiver for the tests: verifies every delivery with the official `standardwebhooks`
package and appends one JSON line per delivery to a log: {"id", "type", "verified"}. A delivery that
does not verify is answered 400 and logged as verified: false.

    WEBHOOK_SECRET=whsec_... python receiver.py LOG [HOLD_FIRST_SECS]

Prints "listening PORT" once it listens on 127.0.0.1. With HOLD_FIRST_SECS, the first delivery is
logged and then answered only after that long (the gateway can be killed mid-delivery).
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

LOG = sys.argv[1]
HOLD_FIRST = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
HOOK = Webhook(os.environ["WEBHOOK_SECRET"])
lock = threading.Lock()
seen = {"n": 0}


def log(line):
    with lock:
        with open(LOG, "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        seen["n"] += 1
        return seen["n"]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            payload = HOOK.verify(body, headers)
        except Exception as e:  # any verification failure
            log({"id": headers.get("webhook-id"), "verified": False, "error": str(e)})
            self.send_response(400)
            self.end_headers()
            return
        n = log({"id": headers["webhook-id"], "type": payload.get("type"), "verified": True, "data": payload.get("data")})
        if n == 1 and HOLD_FIRST > 0:
            time.sleep(HOLD_FIRST)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()
