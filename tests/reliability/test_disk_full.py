"""Disk full, for real: the blob store or the upload staging directory on a 2 MiB tmpfs. Ingest and upload
fail with a clear message, leave no partial file, and the store keeps working once the big write is gone.
Without the privilege to mount, the CLI case runs in a subprocess under RLIMIT_FSIZE instead."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from probes import BundleWriter
from tests.reliability.helpers import AUTH, EXE, TOKEN, check_blob_store
from validator.app.api import create_app
from validator.app.cli import main
from validator.service import Service
from validator.settings import Settings

SIZE = 2 << 20


def _mount_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


@contextlib.contextmanager
def tiny_disk(path: Path) -> Iterator[bool]:
    mounted = _mount_tmpfs(path)
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _bundle(root: Path, name: str, numel: int) -> Path:
    with BundleWriter(root / name, run_name=name, part="p0") as w:
        w.add("w", torch.arange(numel, dtype=torch.float32), step=0)
        w.add("small", torch.ones(16), step=0)
    return root / name


def test_ingest_into_a_full_blob_store(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = tmp_path / "full"
    home = tmp_path / "home"
    small = _bundle(tmp_path, "small", 1000)
    big = _bundle(tmp_path, "big", 3 * SIZE // 4)  # 6 MiB of float32: more than the disk holds
    with tiny_disk(blobs) as mounted:
        if not mounted:
            _ingest_under_rlimit(tmp_path, small, big)
            return
        monkeypatch.setenv("VALIDATOR_BLOB_URL", f"file://{blobs}")
        assert main(["--home", str(home), "ingest", str(small)]) == 0
        capsys.readouterr()
        code = main(["--home", str(home), "ingest", str(big)])
        _, err = capsys.readouterr()
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0] and "tensor 'w'" in lines[0], err
        assert "tensors-00000.safetensors" in lines[0]
        # nothing half-written: no temporary file, no blob of the failed run, the earlier run intact
        blobs_after = check_blob_store(blobs)
        assert len(blobs_after) == 2
        assert main(["--home", str(home), "runs", "--json"]) == 0
        out, _ = capsys.readouterr()
        assert '"small"' in out and '"big"' not in out
        assert main(["--home", str(home), "compare", "small", str(small)]) == 0
        # the space the failed ingest took is free again: another run fits
        capsys.readouterr()
        assert main(["--home", str(home), "ingest", str(small), "--name", "small2"]) == 0


def _ingest_under_rlimit(tmp_path: Path, small: Path, big: Path) -> None:
    """Fallback: the same ingest, in a process that may not write files larger than 1 MiB (EFBIG)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    env = {**os.environ, "VALIDATOR_HOME": str(tmp_path / "home")}
    env.pop("VALIDATOR_BLOB_URL", None)
    env.pop("VALIDATOR_DATABASE_URL", None)
    r = subprocess.run([EXE, "ingest", str(big)], env=env, capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "File too large" in r.stderr and "tensor 'w'" in r.stderr
    check_blob_store(tmp_path / "home" / "blobs")
    r = subprocess.run([EXE, "ingest", str(small)], env=env, capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["staging", "blobs"])
async def test_upload_onto_a_full_disk(tmp_path: Path, where: str) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home, tokens=(TOKEN,))
    with tiny_disk(home / where) as mounted:
        if not mounted:
            pytest.skip("needs root to mount a tmpfs (the CLI case covers the fallback)")
        svc = Service(settings)
        app = create_app(settings, service=svc)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/api/v1", headers=AUTH) as c:
                assert (await c.post("/runs", json={"name": "r"})).status_code == 201
                url = "/runs/r/files/p0/tensors-00000.safetensors"
                r = await c.put(url, content=b"\0" * (3 * SIZE))
                assert r.status_code == 507, r.text
                assert "No space left on device" in r.json()["detail"] and "p0/tensors-00000.safetensors" in r.json()["detail"]
                st = (await c.get(url)).json()
                assert st == {"complete": False, "received": 0, "sha256": None, "created": None}
                assert [p.name for p in (home / "staging").iterdir()] == []
                check_blob_store(home / "blobs")
                # once the big write is gone, the same disk takes a normal upload
                r = await c.put(url, content=b"\1" * 1000)
                assert r.status_code == 200 and r.json()["complete"], r.text
                assert (await c.get("/health")).status_code == 200
        finally:
            svc.close()
