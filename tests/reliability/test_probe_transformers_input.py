"""`validator probe transformers` with absurd input: sizes that cannot fit are refused before anything is
allocated (exit 2, naming the field), prompts that are no regular file or pass the model's context are
refused before a model runs, and an error exit ends with its message (no teardown noise after it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT
from tests.servers import VALIDATOR
from validator.app.cli import main

pytest.importorskip("transformers")

SMALL = {"model_type": "llama", "vocab_size": 258, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256}


def _probe(tmp_path: Path, capsys: Any, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["probe", "transformers", "--out", str(tmp_path / "out"), "--limit", "1", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("field", "value"), [("hidden_size", 10**9), ("vocab_size", 10**12), ("num_hidden_layers", 10**7)])
def test_sizes_that_cannot_fit_are_refused_before_allocating(tmp_path: Path, capsys: Any, field: str, value: int) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**SMALL, field: value}))
    code, err = _probe(tmp_path, capsys, "--model", str(cfg))
    assert code == 2, err
    assert f"{cfg}: {field} {value:,} makes a model of about" in err and "refused before allocating" in err, err
    # the same config in a model directory (config.json beside weights) and as a draft
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(cfg.read_text())
    (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    code, err = _probe(tmp_path, capsys, "--model", str(d))
    assert code == 2 and f"{d}: {field} {value:,} makes a model" in err, err
    small = tmp_path / "small.json"
    small.write_text(json.dumps(SMALL))
    code, err = _probe(tmp_path, capsys, "--model", str(small), "--draft", str(cfg))
    assert code == 2 and f"{cfg}: {field} {value:,} makes a model" in err, err
    assert not (tmp_path / "out" / "parts").exists()


def test_sizes_must_be_whole_numbers(tmp_path: Path, capsys: Any) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**SMALL, "max_position_embeddings": 0}))
    code, err = _probe(tmp_path, capsys, "--model", str(cfg))
    assert code == 2 and "max_position_embeddings must be a whole number from 1" in err, err


def test_prompts_that_are_no_regular_file_or_pass_the_context(tmp_path: Path, capsys: Any) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(SMALL))
    for where in ("/dev/zero", str(tmp_path)):
        code, err = _probe(tmp_path, capsys, "--model", str(cfg), "--prompts", where)
        assert code == 2 and f"{where}: the prompts must be a regular file" in err, err
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"id": "huge", "prompt": "x" * 200_000}) + "\n")
    code, err = _probe(tmp_path, capsys, "--model", str(cfg), "--prompts", str(long), "--limit", "2")
    assert code == 2, err
    assert "prompt 'huge' is 200,001 tokens; with --max-new-tokens 64 that passes the model's context of 256 tokens" in err
    fits = tmp_path / "fits.jsonl"
    fits.write_text(json.dumps({"prompt": "x" * 190}) + "\n")  # 191 tokens + 64 = 255
    code, err = _probe(tmp_path, capsys, "--model", str(cfg), "--prompts", str(fits), "--capture", "off", "--max-new-tokens", "64")
    assert code == 0, err


def test_an_error_exit_ends_with_its_message(tmp_path: Path) -> None:
    """The real command, failing after transformers loaded torch._dynamo and with it triton, whose nanobind
    bindings used to print ~30 lines of `nanobind: leaked ...` at exit: stderr ends with the error."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((ROOT / "examples/models/gsm8k-llama-tiny/target/config.json").read_text())
    (d / "model.safetensors").write_bytes(b"not safetensors")
    got = subprocess.run([VALIDATOR, "probe", "transformers", "--model", str(d), "--out", str(tmp_path / "o"),
                          "--prompts", str(ROOT / "tests/data/gsm8k/test.jsonl"), "--limit", "1"],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip().splitlines()[-1].startswith(f"validator: error: {d}: cannot load the model"), got.stderr[-2000:]
    assert "nanobind" not in got.stderr
