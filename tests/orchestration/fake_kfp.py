"""A stand-in for the Kubeflow Pipelines API server on 127.0.0.1 that records what it is sent.

It answers ``POST /apis/v2beta1/runs`` (KFP's RunService.CreateRun) as the real server does —
the created run as JSON, with a run id and state PENDING — and keeps each request's path,
headers and JSON body, so a test checks exactly what ``sage-tfx submit`` sent. ``status``
makes it refuse every request with that HTTP status instead (e.g. 401).
"""
from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional

RUNS_PATH = "/apis/v2beta1/runs"
MAX_BODY = 16 * 1024 * 1024


class FakeKfp:
    """``with FakeKfp() as kfp: ... kfp.url ... kfp.requests``."""

    def __init__(self, status: Optional[int] = None):
        self.status = status
        self.requests: List[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    return self._reply(413, {"error": "body too large"})
                raw = self.rfile.read(length)
                outer.requests.append({"method": "POST", "path": self.path,
                                       "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "body": json.loads(raw or b"null")})
                if outer.status is not None:
                    return self._reply(outer.status, {"error": "refused", "code": 16})
                if self.path != RUNS_PATH:
                    return self._reply(404, {"error": "not found"})
                run = dict(outer.requests[-1]["body"], run_id=str(uuid.uuid4()),
                           state="PENDING")
                return self._reply(200, run)

            def _reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeKfp":
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
