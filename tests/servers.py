"""Real server processes for end-to-end tests: a free loopback port, start, wait for health, stop."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

VALIDATOR = str(Path(sys.executable).parent / "validator")  # this environment's `validator` command


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_tail(log_path: Path | None, limit: int = 3000) -> str:
    if log_path is None or not log_path.exists():
        return ""
    return log_path.read_text(errors="replace")[-limit:]


def wait_healthy(
    proc: subprocess.Popen[bytes], health_url: str, *, timeout: float = 60, log_path: Path | None = None
) -> None:
    """Poll ``health_url`` until it answers 200. Raises ``RuntimeError`` (with the log's tail) when the
    process exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{_log_tail(log_path)}")
        try:
            if httpx.get(health_url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not answer {health_url} within {timeout:g} s:\n{_log_tail(log_path)}")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def start_process(
    cmd: Sequence[str],
    health_url: str,
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` (stdout and stderr appended to ``log_path``), wait until ``health_url`` answers 200
    (at most ``timeout`` seconds), yield the process, and stop it on the way out."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(cmd), env=None if env is None else dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_healthy(proc, health_url, timeout=timeout, log_path=log_path)
            yield proc
        finally:
            stop_process(proc)


@contextlib.contextmanager
def validator_serve(env: Mapping[str, str], log_path: Path, *, timeout: float = 60) -> Iterator[str]:
    """`validator serve` on a free loopback port with ``env``; yields its origin (``http://127.0.0.1:PORT``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with start_process(
        [VALIDATOR, "serve", "--port", str(port)], url + "/api/v1/health", log_path=log_path, env=env, timeout=timeout
    ):
        yield url
