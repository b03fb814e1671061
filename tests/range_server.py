"""A small HTTP server on 127.0.0.1 for the remote-source tests: files, Range, faults.

Serves a directory with GET (``Range: bytes=a-b``, answered 206) and HEAD
(``Content-Length``, ``ETag``, ``Last-Modified``).  ``faults[name]`` is a list
of what the next requests for that file meet, one entry each: ``503`` (that
status), ``"stall"`` (the answer is held ``stall_seconds``), ``"reset"`` (the
connection is closed without an answer).  Names under ``forbidden/`` answer
403; missing files 404.  ``requests`` counts each file's requests.

``latency`` seconds are added to every request (the round trip of a distant
store); ``in_flight`` is the number of requests being answered now and
``most_in_flight`` the most there ever were at once, which is how tests see
that a client's requests overlap without timing anything.
"""

from __future__ import annotations

import collections
import email.utils
import http.server
import os
import threading


class RangeServer:
    def __init__(self, root: str, stall_seconds: float = 5.0, latency: float = 0.0) -> None:
        self.root = root
        self.stall_seconds = stall_seconds
        self.latency = latency
        self.in_flight = 0
        self.most_in_flight = 0
        self._counting = threading.Lock()
        self.faults: dict[str, list] = collections.defaultdict(list)
        self.requests: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body):
                with server._counting:
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    if server.latency:
                        server._stop.wait(server.latency)
                    self._answer_now(body)
                finally:
                    with server._counting:
                        server.in_flight -= 1

            def _answer_now(self, body):
                name = self.path.lstrip("/").split("?", 1)[0]
                server.requests[name] += 1
                if server.faults[name]:
                    fault = server.faults[name].pop(0)
                    if fault == "reset":
                        self.close_connection = True
                        self.connection.close()
                        return
                    if fault == "stall":
                        server._stop.wait(server.stall_seconds)
                    else:
                        return self._status(int(fault))
                if name.startswith("forbidden/"):
                    return self._status(403)
                path = os.path.join(server.root, name)
                if not os.path.isfile(path):
                    return self._status(404)
                with open(path, "rb") as file:
                    stat = os.fstat(file.fileno())
                    size = stat.st_size
                    start, end, status = 0, size - 1, 200
                    ranged = self.headers.get("Range")
                    if ranged and ranged.startswith("bytes="):
                        first, _, last = ranged[6:].partition("-")
                        start = int(first)
                        end = min(int(last), size - 1) if last else size - 1
                        status = 206
                    part = os.pread(file.fileno(), max(end + 1 - start, 0), start)
                self.send_response(status)
                self.send_header("Content-Length", str(len(part)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{stat.st_size}-{stat.st_mtime_ns}"')
                self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime,
                                                                         usegmt=True))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if body:
                    self.wfile.write(part)

            def _status(self, code):
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # many connections opened at once: none refused

            def handle_error(self, request, client_address):
                pass  # the resets this server is told to make, and clients gone

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "RangeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
