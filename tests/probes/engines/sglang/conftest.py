"""Fixtures: the real SGLang sources (0.5.9 in the venv, 0.5.23 in .venv/sglang-versions/) and the fake package."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes.engines.sglang import sglang_root, sglang_version
from tests.paths import ROOT

from .fake_sglang import write_fake_sglang

SIDE = ROOT / ".venv" / "sglang-versions"


@pytest.fixture(scope="session")
def sglang_0523() -> Path:
    """The sglang 0.5.23 package folder (source only: it is never imported here)."""
    root = sglang_root([str(SIDE / "0.5.23")])
    if root is None or sglang_version(root) != "0.5.23":
        pytest.skip("sglang 0.5.23 is not installed in .venv/sglang-versions/0.5.23 (scripts/setup installs it)")
    return root


@pytest.fixture(scope="session")
def sglang_059() -> Path:
    root = sglang_root()
    if root is None or sglang_version(root) != "0.5.9":
        pytest.skip("sglang 0.5.9 is not installed in the venv (scripts/setup installs it)")
    return root


def _purge() -> dict[str, object]:
    gone = {
        k: sys.modules.pop(k)
        for k in list(sys.modules)
        if k == "sglang" or k.startswith("sglang.") or k == "fake_server"
    }
    return gone


@pytest.fixture
def fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake ``sglang`` package first on ``sys.path``; any imported SGLang modules are set aside meanwhile."""
    from probes.engines.sglang import deactivate

    root = write_fake_sglang(tmp_path / "fake")
    saved = _purge()
    monkeypatch.syspath_prepend(str(root))
    for k in ("FAKE_TP_RANK", "FAKE_TP_SIZE", "FAKE_PP_RANK", "FAKE_PP_SIZE", "FAKE_DECODE_STEPS"):
        monkeypatch.delenv(k, raising=False)
    try:
        yield root
    finally:
        deactivate()
        _purge()
        sys.modules.update(saved)  # type: ignore[arg-type]
