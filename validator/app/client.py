"""The remote side of the CLI: talks to a `validator serve` over its JSON API (httpx)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from probes.core.bundle import MANIFEST, PART_FILE
from validator.errors import InputError, NotFoundError, ValidatorError
from validator.runs.sources import read_bundle

__all__ = ["Client"]

CHUNK = 8 << 20


class RemoteError(ValidatorError):
    pass


class Client:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 600.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base = url.rstrip("/") + "/api/v1"
        self.http = httpx.Client(headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _check(self, r: Any) -> Any:
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail")
            except ValueError:
                detail = r.text[:500]
            err = NotFoundError if r.status_code == 404 else (InputError if r.status_code < 500 else RemoteError)
            raise err(f"server said {r.status_code}: {detail}")
        return r.json()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            return self._check(self.http.request(method, self.base + path, **kw))
        except httpx.HTTPError as exc:
            raise RemoteError(f"cannot reach {self.base}: {exc}") from None

    # -- push -----------------------------------------------------------------------------------
    def push(self, bundle: str | Path, *, name: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Upload a bundle (validated locally first) and finalize it. Safe to retry after a failure."""
        root = Path(bundle)
        view = read_bundle(root)  # refuse a broken bundle before sending anything
        run_name = name or view.name
        self.request("POST", "/runs", json={"name": run_name, "labels": {**view.labels, **(labels or {})}})
        files = [("_root", root / MANIFEST)]
        for part in sorted(p for p in (root / "parts").iterdir() if p.is_dir()):
            for f in sorted(part.iterdir()):
                if f.is_file() and not f.name.startswith(".") and f.name != PART_FILE:
                    files.append((part.name, f))
            files.append((part.name, part / PART_FILE))  # last: a part is complete once this arrives
        for part_name, f in files:
            self._upload(run_name, part_name, f)
        run: dict[str, Any] = self.request("POST", f"/runs/{run_name}/finalize")
        return run

    def _upload(self, run: str, part: str, path: Path) -> None:
        url = f"/runs/{run}/files/{part}/{path.name}"
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while b := f.read(CHUNK):
                h.update(b)
        st = self.request("GET", url)
        if st["complete"]:
            if st["sha256"] != h.hexdigest():
                raise InputError(f"{path}: the server holds different content for {part}/{path.name}")
            return
        offset = st["received"]

        def body() -> Any:
            with open(path, "rb") as f:
                f.seek(offset)
                while b := f.read(CHUNK):
                    yield b

        self.request("PUT", url, params={"offset": offset, "final": True, "sha256": h.hexdigest()}, content=body())

    # -- queries --------------------------------------------------------------------------------
    def compare(self, a: str, b: str, *, floor: tuple[str, str] | None = None, policy: dict[str, Any] | None = None) -> dict[str, Any]:
        import time

        rec = self.request("POST", "/comparisons", json={"a": a, "b": b, "floor": list(floor) if floor else None, "policy": policy})
        while rec["status"] in ("queued", "running"):
            time.sleep(1.0)
            rec = self.request("GET", f"/comparisons/{rec['id']}")
        if rec["status"] == "error":
            raise InputError(f"the server could not compare: {rec['error']}")
        return dict(rec["result"], comparison_id=rec["id"])
