from __future__ import annotations

from pathlib import Path

import pytest

NAMES = "target.hidden,target.logits,target.k,target.v,draft.k,draft.v,draft.logits"
COMMON = ["--limit", "8", "--max-new-tokens", "32", "--threads", "1", "--names", NAMES]


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`validator probe transformers` in the three modes on the committed tiny pair (8 GSM8K prompts, 32
    tokens; ~40 s on CPU), built once for test_transformers_pd.py (the CLI) and test_transformers_pd_server.py (API, dashboard)."""
    from validator.app.cli import main

    root = tmp_path_factory.mktemp("hf")
    out = {}
    for mode in ("d-only", "pd", "pd-broken"):
        assert main(["probe", "transformers", "--mode", mode, "--out", str(root / mode), *COMMON]) == 0
        out[mode] = root / mode
    return out
