"""A real HTTP receiver on loopback for webhook tests."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A real HTTP server: answers ``statuses`` in turn (then 200), records every body."""

    def __init__(self, statuses: list[int], delay_s: float = 0.0) -> None:
        self.statuses = list(statuses)
        self.delay_s = delay_s
        self.bodies: list[dict[str, object]] = []
        self.answers: list[int] = []
        self.lock = threading.Lock()


@contextmanager
def receiver(statuses: list[int], delay_s: float = 0.0) -> Iterator[tuple[str, Receiver]]:
    state = Receiver(statuses, delay_s)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(state.delay_s)
            with state.lock:
                status = state.statuses.pop(0) if state.statuses else 200
                state.answers.append(status)
                if self.headers["Content-Type"] == "application/json":
                    state.bodies.append(json.loads(body))
            # A slow answer's client may have given up (the deadline under test): nothing to say.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
