"""`validator policy import-sglang`: SGLang comparator rules in, a policy file out, used by `validator compare`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.paths import ROOT
from validator.app.cli import main
from validator.judging.policy import Policy

DUMPS = ROOT / "tests" / "validator" / "runs" / "sglang0523_dumps.py"
SIDE = ROOT / ".venv" / "sglang-versions" / "0.5.23" / "sglang" / "srt" / "debug_utils"
HELP_RULES = [".*expert.*", "rel <= 0.0085 or max_abs <= 1e-3", ".*", "rel <= 0.0085"]  # the comparator's --help


def _holds(predicate: str, metrics: dict[str, float]) -> bool:
    """SGLang's evaluation of a predicate (threshold_dsl.evaluate_predicate: eval with no builtins)."""
    env = {"rel": metrics["rel_diff"], "max_abs": metrics["max_abs"], "mean_abs": metrics["mean_abs"]}
    return bool(eval(compile(predicate, "<predicate>", "eval"), {"__builtins__": {}}, env))


def test_import_then_compare_judges_as_the_rules_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = torch.Generator().manual_seed(1)
    a = {n: torch.randn(32, 16, generator=g) for n in ("moe.expert.w1", "moe.expert.w2", "hidden", "logits")}
    noise = {"moe.expert.w1": 0.2, "moe.expert.w2": 1e-5, "hidden": 0.05, "logits": 0.2}  # rel_diff ~ s^2 / 2
    b = {n: t + noise[n] * torch.randn(t.shape, generator=g) for n, t in a.items()}
    b["moe.expert.w2"][0, 0] += 0.5  # rel_diff small, max_abs large: the expert rule's first alternative holds
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    policy = tmp_path / "p.toml"
    assert main(["policy", "import-sglang", *HELP_RULES, "-o", str(policy)]) == 0
    assert "wrote" in capsys.readouterr().err
    assert len(Policy.load(policy).rules) == 2
    assert main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--policy", str(policy),
                 "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    status = {p["name"]: p["status"] for p in doc["pairs"]}
    assert status == {"moe.expert.w1": "fail", "moe.expert.w2": "pass", "hidden": "pass", "logits": "fail"}
    for p in doc["pairs"]:
        predicate = HELP_RULES[1] if "expert" in p["name"] else HELP_RULES[3]
        assert (p["status"] == "pass") == _holds(predicate, p["metrics"]), p["name"]
    fails = {p["name"]: p["reasons"][0] for p in doc["pairs"] if p["status"] == "fail"}
    assert fails["moe.expert.w1"].startswith("none of any_of holds: rel_diff ") and "> 0.0085; max_abs 0.652 > 0.001" in fails["moe.expert.w1"]
    assert fails["logits"].startswith("rel_diff ") and fails["logits"].endswith("> 0.0085")


def test_the_flag_form_and_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "import-sglang", "--diff-threshold", "0.0085"]) == 0
    text = capsys.readouterr().out
    assert "# --diff-threshold 0.0085" in text and 'match = "*"\nrel_diff_max = 0.0085' in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([".*", "rel >= 1e-3"], "rule 1 ('.*' 'rel >= 1e-3'): 'rel >= 0.001' is a lower bound on a difference"),
        (["[", "rel <= 1e-3"], "the regex does not compile"),
        (["x", "rel <= 1e-3", "y"], "odd number of arguments (3)"),
        (["0.01x"], "one argument must be a float"),
        ([".*", "rel <= 1", "--diff-threshold", "0.1"], "not both"),
    ],
)
def test_a_bad_rule_exits_2_naming_it(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "import-sglang", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and message in out.err and "Traceback" not in out.err


def test_sglang_default_imported_passes_the_weight_perturbation_as_sglang_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dumps by the real 0.5.23 dumper: every weight scaled by 1 + 0.01 N(0, 1), TP 2 against TP 1. SGLang's
    default (rel <= 1e-3) passes it, and so does that default imported; validator's own defaults fail it."""
    if not (SIDE / "dumper.py").exists():
        pytest.skip(f"sglang 0.5.23 is not unpacked at {SIDE.parents[2]} (scripts/setup installs it)")
    got = subprocess.run([sys.executable, str(DUMPS), str(tmp_path), "all"], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    policy = tmp_path / "sglang-default.toml"
    assert main(["policy", "import-sglang", "-o", str(policy)]) == 0
    home = ["--home", str(tmp_path / "home")]
    runs = [str(tmp_path / "tp1"), str(tmp_path / "tp2-w")]
    capsys.readouterr()
    assert main([*home, "compare", *runs, "--policy", str(policy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["pairs"]) == 22 and all(_holds("rel <= 0.001", p["metrics"]) for p in doc["pairs"])
    assert main([*home, "compare", *runs]) == 1
