"""nginx from the distribution on 127.0.0.1, serving a folder: the remote tests' real server.

``NginxServer(root)`` writes a minimal configuration in a temporary prefix
(one process, no daemon, logs and temporary files inside the prefix), starts
nginx, waits until it accepts connections, and stops it on exit.  nginx is
looked for on PATH and in /usr/sbin; ``nginx_binary()`` is None without it
(``.ci/run`` installs it: apt-get install nginx-light).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

_CONFIG = """
daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
"""


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found is None and os.access("/usr/sbin/nginx", os.X_OK):
        found = "/usr/sbin/nginx"
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NginxServer:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.port = _free_port()
        self._prefix = tempfile.mkdtemp(prefix="fastload-nginx-")
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "NginxServer":
        config = os.path.join(self._prefix, "nginx.conf")
        with open(config, "w") as out:
            out.write(_CONFIG.format(prefix=self._prefix, port=self.port, root=self.root))
        self._process = subprocess.Popen(
            [nginx_binary(), "-p", self._prefix, "-c", config, "-e",
             os.path.join(self._prefix, "error.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                error = self._process.stderr.read().decode(errors="replace")
                self.__exit__()
                raise RuntimeError(f"nginx exited at start ({self._process.returncode}): {error}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("nginx did not accept connections within 15 s")

    def __exit__(self, *exc) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.close()
        shutil.rmtree(self._prefix, ignore_errors=True)
