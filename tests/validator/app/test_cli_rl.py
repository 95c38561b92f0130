"""`validator rl kl` and `validator manifest write / diff` import no torch (unless a changed tensor is compared
numerically) and never open the store."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.fresh_interpreter import run_child, torch_stack

CHILD = """
import contextlib, io
from validator.app.cli import main

home, items = sys.argv[1], json.loads(sys.argv[2])
results = []
for argv in items:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results.append(main(["--home", home, *argv]))
report(results=results)
"""


def test_rl_and_manifest_commands_import_no_torch(tmp_path: Path) -> None:
    with open(tmp_path / "lp.jsonl", "w") as f:
        for step in range(3):
            for s in range(4):
                for t in range(3):
                    f.write(json.dumps({"step": step, "sample_id": s, "token_index": t, "rollout_logprob": -1.0 - 0.01 * t,
                                        "train_logprob": -1.0 - 0.011 * t}) + "\n")
    save_file({"w": torch.ones(4), "x.lora_B": torch.zeros(2)}, str(tmp_path / "m.safetensors"))
    m = str(tmp_path / "m.json")
    commands = [
        ["rl", "kl", str(tmp_path / "lp.jsonl"), "--json"],
        ["manifest", "write", str(tmp_path / "m.safetensors"), "-o", m, "--version", "1"],
        ["manifest", "diff", m, str(tmp_path / "m.safetensors"), "--b-version", "1"],
        ["manifest", "diff", m, m, "--b-version", "2"],
    ]
    home = tmp_path / "no-home"
    out = run_child(CHILD, str(home), json.dumps(commands))
    assert out["results"] == [3, 0, 0, 1], out["results"]
    assert not out["torch"], torch_stack(out)
    assert not out["alembic"] and not home.exists()
