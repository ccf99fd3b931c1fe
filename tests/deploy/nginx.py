"""deploy/nginx/nginx.conf run by a real nginx in front of gateways started by a test.

nginx (``/usr/sbin/nginx``) runs the file with only what a test machine needs changed
(listen address, pid, logs and temporary paths under a temporary directory,
``upstream.conf`` pointed at the gateways); every substitution must apply exactly once,
so the tests follow the file and break if its shape changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NGINX = Path("/usr/sbin/nginx")
WAIT_S = 30.0  # generous: a loaded 2-core machine


@dataclass
class Nginx:
    base: str
    ws_url: str
    conf: Path
    prefix: Path
    access_log: Path
    error_log: Path
    dead_upstream: str

    def logs(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in (self.access_log, self.error_log) if p.exists()
        )

    def access_entries(self) -> list[dict[str, Any]]:
        if not self.access_log.exists():
            return []
        lines = self.access_log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def render_nginx(prefix: Path, port: int, upstreams: list[str]) -> Path:
    """deploy/nginx/nginx.conf with paths and ports for this machine, next to an
    upstream.conf listing ``upstreams``."""
    text = (DEPLOY / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    temp_paths = "".join(
        f"    {kind}_temp_path {prefix / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;" if os.geteuid() == 0 else ""  # non-root: workers run as we do
    substitutions = [
        (r"^user\s+[^;]+;", user),
        (r"^worker_processes\s+[^;]+;", "worker_processes 1;"),
        (r"^worker_rlimit_nofile\s+[^;]+;", ""),
        (r"worker_connections\s+\d+;", "worker_connections 512;"),
        (r"^pid\s+[^;]+;", f"pid {prefix / 'nginx.pid'};"),
        (r"^error_log\s+/var/log/nginx/error\.log", f"error_log {prefix / 'error.log'}"),
        (r"access_log\s+/var/log/nginx/access\.log", f"access_log {prefix / 'access.log'}"),
        (r"^\s*listen\s+80;", f"        listen 127.0.0.1:{port};"),
        (r"^http\s*\{\n", "http {\n" + temp_paths),
    ]
    for pattern, replacement in substitutions:
        text, count = re.subn(pattern, replacement, text, count=0, flags=re.M)
        assert count == 1, f"nginx.conf: {pattern!r} matched {count} times, expected once"
    conf = prefix / "nginx.conf"
    conf.write_text(text, encoding="utf-8")
    (prefix / "upstream.conf").write_text(
        "".join(f"server {u};\n" for u in upstreams), encoding="utf-8"
    )
    return conf


def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nginx did not listen on {port} within {WAIT_S}s")


@contextlib.contextmanager
def running_nginx(prefix: Path, upstreams: list[str], *, dead: str = "") -> Iterator[Nginx]:
    """nginx on a free port in front of ``upstreams`` until the block ends."""
    port = free_port()
    conf = render_nginx(prefix, port, upstreams)
    stderr = prefix / "nginx.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [str(NGINX), "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_port(port, proc, stderr)
        yield Nginx(
            base=f"http://127.0.0.1:{port}",
            ws_url=f"ws://127.0.0.1:{port}/v1/stream",
            conf=conf,
            prefix=prefix,
            access_log=prefix / "access.log",
            error_log=prefix / "error.log",
            dead_upstream=dead,
        )
    finally:
        proc.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
