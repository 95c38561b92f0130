"""Shared pieces of the reliability tests: bundles on disk, a real server process, store inspection."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from probes.core.bundle import MANIFEST, PART_FILE
from tests.servers import VALIDATOR as EXE
from tests.servers import free_port, stop_process, wait_healthy

REPO = Path(__file__).resolve().parents[2]
TOKEN = "rel-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def safetensors_bytes(header: dict[str, Any], data: bytes = b"", *, hlen: int | None = None) -> bytes:
    """A safetensors file from a header dict (anything, even invalid) and raw data bytes."""
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (relative), for before/after comparisons."""
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def blob_files(blob_dir: Path) -> dict[str, Path]:
    """sha256 -> path of every blob in a local blob store (``tmp/`` excluded)."""
    out = {}
    for p in blob_dir.glob("??/*"):
        if p.parent.name != "tmp" and p.is_file():
            out[p.parent.name + p.name] = p
    return out


def check_blob_store(blob_dir: Path) -> dict[str, Path]:
    """Every blob's content hashes to its name, and only hash-named files exist; returns the blobs."""
    blobs = blob_files(blob_dir)
    for sha, p in blobs.items():
        assert len(sha) == 64 and all(c in "0123456789abcdef" for c in sha), p
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while b := f.read(1 << 20):
                h.update(b)
        assert h.hexdigest() == sha, f"blob {p} does not hash to its name"
    for p in blob_dir.rglob("*"):
        rel = p.relative_to(blob_dir)
        if p.is_file():
            assert rel.parts[0] != "tmp", f"temporary file left behind: {p}"
            assert rel.parts[0] + rel.parts[1] in blobs, f"unexpected file in the blob store: {p}"
    return blobs


def db_blobs(settings: Any) -> set[str]:
    """The sha256 of every blob row in the store's database."""
    from sqlalchemy import select

    from validator.service import Service
    from validator.store.models import Blob

    svc = Service(settings)
    try:
        with svc.session() as s:
            return set(s.scalars(select(Blob.sha256)))
    finally:
        svc.close()


def bundle_files(bundle: Path) -> list[tuple[str, Path]]:
    """(part, file) in upload order: the manifest first, each part's part.json last."""
    files = [("_root", bundle / MANIFEST)]
    for part in sorted(p for p in (bundle / "parts").iterdir() if p.is_dir()):
        files += [(part.name, f) for f in sorted(part.iterdir()) if f.name != PART_FILE and not f.name.startswith(".")]
        if (part / PART_FILE).exists():
            files.append((part.name, part / PART_FILE))
    return files


class Server:
    """A real ``validator serve`` process on 127.0.0.1 (or the fault-injecting wrapper), killable at will."""

    def __init__(self, home: Path, *, db_url: str | None = None, fault: str | None = None, log: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log or home.parent / f"server-{self.port}.log"
        self.env = {**os.environ, "VALIDATOR_HOME": str(home), "VALIDATOR_TOKENS": TOKEN, **(env or {})}
        self.env.pop("VALIDATOR_DATABASE_URL", None)
        if db_url:
            self.env["VALIDATOR_DATABASE_URL"] = db_url
        if fault:
            self.env["VALIDATOR_TEST_FAULT"] = fault
            self.env["PYTHONPATH"] = str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")
            cmd = [sys.executable, "-m", "tests.reliability.faulty_server", "--port", str(self.port)]
        else:
            cmd = [EXE, "serve", "--port", str(self.port)]
        self.home.parent.mkdir(parents=True, exist_ok=True)
        self._logf = open(self.log, "ab")  # closed in kill()/stop()
        self.proc = subprocess.Popen(cmd, env=self.env, cwd=REPO, stdout=self._logf, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.proc, self.url + "/api/v1/health", timeout=60, log_path=self.log)
        except BaseException:
            self.stop()
            raise

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url + "/api/v1", headers=AUTH, timeout=kw.pop("timeout", 60), **kw)

    def kill(self) -> None:
        """SIGKILL: no shutdown handler, no cleanup, exactly like a crash or an OOM kill."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._logf.close()

    def stop(self) -> None:
        stop_process(self.proc, timeout=30)
        self._logf.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(pred: Any, timeout: float = 30, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"condition not reached within {timeout}s")
