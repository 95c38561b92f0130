"""probes.engines.transformers on real transformers models (CPU): capture under generate, summary mode, budget,
detaching, acceptance records from assisted generation, the draft hand-off.

A randomly initialised tiny Llama for the structure and the coordinates; the committed GSM8K-trained pair
(examples/models/gsm8k-llama-tiny) where acceptance must mean something.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from probes.core.capture import DISABLED, ProbeSession
from probes.core.config import ProbeConfig
from probes.engines.transformers import (
    AssistedAcceptance,
    HandoffInjector,
    ModelCapture,
    TransformersProbeError,
    cache_kv,
    capture_kv,
)
from tests.paths import ROOT
from validator.workloads.transformers_pd import _cache_kw

transformers = pytest.importorskip("transformers")

PAIR = ROOT / "examples" / "models" / "gsm8k-llama-tiny"
EOS = 257


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny(layers: int = 2, seed: int = 0, kind: str = "llama") -> Any:
    config_cls = transformers.LlamaConfig if kind == "llama" else transformers.Qwen3Config
    cfg = config_cls(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        eos_token_id=63,
        pad_token_id=63,
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def part(bundle: Path, name: str) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    doc = json.loads((bundle / "parts" / name / "part.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted((bundle / "parts" / name).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return doc["tensors"], tensors


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_capture_under_generate(tmp_path: Path, kind: str) -> None:
    model = tiny(kind=kind)
    s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "b"), part="p"))
    cap = ModelCapture(model, s, role="target").attach()
    cap.begin_request("r0")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=63)
    cap.detach()
    s.close()
    recs, tensors = part(tmp_path / "b", "p")
    by = {(r["name"], r["coords"]["step"], r["coords"].get("layer")): r for r in recs}
    # prefill = step 0 over positions 0-5, then one decode step per new token (the last token is not fed back)
    steps = sorted({r["coords"]["step"] for r in recs})
    assert steps == [0, 1, 2, 3]
    assert by[("target.hidden", 0, 1)]["coords"]["tokens"] == [0, 5]
    assert by[("target.hidden", 2, 0)]["coords"]["tokens"] == [6, 7]
    assert by[("target.attn", 1, 1)]["shape"] == [1, 32] and by[("target.mlp", 3, 0)]["shape"] == [1, 32]
    assert by[("target.norm", 0, None)]["shape"] == [5, 32]
    assert {r["coords"]["request"] for r in recs} == {"r0"}
    # generate keeps only the last position's logits at prefill: the tokens coordinate says which row it is
    assert by[("target.logits", 0, None)]["coords"]["tokens"] == [4, 5]
    # the captured logits are the ones generate chose from
    for step in range(4):
        t = tensors[by[("target.logits", step, None)]["key"]]
        assert int(t[-1].argmax()) == int(out[0, 5 + step])
    # the last layer's output, normed, is the captured final norm
    h = tensors[by[("target.hidden", 0, 1)]["key"]]
    assert torch.allclose(model.model.norm(h), tensors[by[("target.norm", 0, None)]["key"]], atol=1e-6)


def test_detached_and_disabled_cost_nothing(tmp_path: Path) -> None:
    model = tiny()
    cap = ModelCapture(model, DISABLED, role="target").attach()
    assert cap.attached and any(m._forward_hooks for m in model.modules())
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    cap.detach()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    with pytest.raises(TransformersProbeError, match="unknown capture point"):
        ModelCapture(model, DISABLED, points=("hidden", "qkv"))
    with pytest.raises(TransformersProbeError, match="out of range"):
        ModelCapture(model, DISABLED, layers=[5])


def test_summary_mode_and_budget(tmp_path: Path) -> None:
    model = tiny()
    s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "s"), part="p", mode="summary", names=("target.hidden",)))
    with ModelCapture(model, s) as cap:
        cap.begin_request("a")
        with torch.no_grad():
            model.generate(
                torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False, eos_token_id=None, pad_token_id=63
            )
    s.close()
    recs, _ = part(tmp_path / "s", "p")
    assert {r["name"] for r in recs} == {"target.hidden.summary"} and len(recs) == 2 * 3
    # hooks only where the name filter keeps the point: the pre-hook and one per decoder layer's output
    assert len(cap._handles) == 0 and s.stats["filtered"] == 0
    s3 = ProbeSession(ProbeConfig(bundle=str(tmp_path / "f"), part="p", names=("target.hidden",)))
    with ModelCapture(model, s3) as cap:
        assert len(cap._handles) == 1 + len(cap.structure.layers)
    s3.close()
    with ModelCapture(model, DISABLED) as cap:  # a disabled session: every hook, each one attribute check
        assert len(cap._handles) == 1 + 3 * len(cap.structure.layers) + 2
    s2 = ProbeSession(ProbeConfig(bundle=str(tmp_path / "t"), part="p", budget_bytes=3000))
    with ModelCapture(model, s2) as cap, pytest.warns(Warning, match="budget"):
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3, 4]]))
    rep = s2.report()
    s2.close()
    assert rep["budget_exhausted"] and rep["dropped_captures"] > 0 and rep["captured_bytes"] <= 3000


def _pair() -> tuple[Any, Any]:
    load = transformers.AutoModelForCausalLM.from_pretrained
    t = load(str(PAIR / "target"), dtype=torch.float32).eval()
    d = load(str(PAIR / "draft"), dtype=torch.float32).eval()
    g = d.generation_config
    g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = 4, "constant", 0.0
    return t, d


def test_assisted_acceptance_records(tmp_path: Path) -> None:
    target, draft = _pair()
    prompt = b"Question: A farmer has 12 cows and buys 7 more. How many cows does he have?\nAnswer:"
    ids = torch.tensor([[256, *prompt]])
    from probes.core.acceptance import AcceptanceRecorder

    rec = AcceptanceRecorder(tmp_path / "a", "p")
    acc = AssistedAcceptance(rec, target, draft)
    s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "a"), part="p", names=("draft.logits", "target.logits")))
    ct = ModelCapture(target, s).attach()
    cd = ModelCapture(draft, s, role="draft", step_from=ct).attach()
    for x in (ct, cd, acc):
        x.begin_request("q")
    with torch.no_grad():
        g = target.generate(
            ids,
            assistant_model=draft,
            max_new_tokens=40,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=EOS,
            logits_processor=[acc.processor],
        )
        plain = target.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    acc.end_request()
    acc.remove()
    ct.detach()
    cd.detach()
    rec.close()
    s.close()
    assert torch.equal(g, plain)  # greedy verification: the output is the target's own
    lines = [json.loads(x) for x in (tmp_path / "a" / "parts" / "p" / "acceptance.jsonl").read_text().splitlines()]
    assert lines == acc.records and [r["step"] for r in lines] == list(range(len(lines)))
    # the records rebuild the output: each step emits its accepted drafts and the target's next token
    emitted: list[int] = []
    for r in lines:
        assert r["proposed"][: r["accepted"]] == r["target_tokens"][: r["accepted"]]
        if r["accepted"] < len(r["proposed"]):
            assert r["proposed"][r["accepted"]] != r["target_tokens"][r["accepted"]]
        emitted += r["target_tokens"][: r["accepted"] + 1]
    new = g[0, ids.shape[1] :].tolist()
    assert emitted[: len(new)] == new
    # a trained pair: the draft is right often, not always
    rate = sum(r["accepted"] for r in lines) / sum(len(r["proposed"]) for r in lines)
    assert 0.2 < rate < 0.95
    # the draft's tensors of verify step k are captured under step k, before the target's
    recs, _ = part(tmp_path / "a", "p")
    dsteps = {r["coords"]["step"] for r in recs if r["name"] == "draft.logits"}
    assert dsteps == {r["step"] for r in lines}


def test_handoff_injection_matches_recompute() -> None:
    target, draft = _pair()
    ids = torch.tensor([[256, *b"Question: 3 + 4 = ?\nAnswer:"]])
    with torch.no_grad():
        cache = transformers.DynamicCache(config=draft.config)
        draft(input_ids=ids, use_cache=True, **{_cache_kw(draft): cache})
        kv = [(k.clone(), v.clone()) for k, v in cache_kv(cache)]
        first = int(target(input_ids=ids).logits[0, -1].argmax())
        full = torch.cat([ids, torch.tensor([[first]])], 1)
        ref = draft.generate(full, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=EOS)
        inj = HandoffInjector(draft)
        inj.arm(kv)
        got = draft.generate(full, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=EOS)
        inj.remove()
    assert inj.used == 1 and torch.equal(ref, got)


def test_capture_kv_shards(tmp_path: Path) -> None:
    k = torch.randn(1, 8, 5, 4)
    s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "k"), part="p"))
    for r in range(2):
        capture_kv(
            s, [(k[:, 4 * r : 4 * r + 4], k[:, 4 * r : 4 * r + 4])], role="draft", step=0, request="x", tp=(r, 2)
        )
    s.close()
    recs, tensors = part(tmp_path / "k", "p")
    ks = sorted((r for r in recs if r["name"] == "draft.k"), key=lambda r: r["shard"]["index"])
    assert [r["shard"] for r in ks] == [{"kind": "split", "index": i, "count": 2, "dim": 1} for i in range(2)]
    whole = torch.cat([tensors[r["key"]] for r in ks], 1)
    assert torch.equal(whole, k[0].transpose(0, 1))


IMPORT_SCRIPT = """
import sys, tempfile
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("transformers", "validator", "sqlalchemy", "pandas", "triton"):
            raise ImportError(f"blocked import of {name}")
sys.meta_path.insert(0, Blocker())
import torch
from torch import nn
from probes.core.capture import ProbeSession
from probes.core.config import ProbeConfig
from probes.engines.transformers import ModelCapture

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Linear(4, 4)
    def forward(self, x):
        return x + self.mlp(x)

class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(4)
        self.lm_head = nn.Linear(4, 7)
    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.lm_head(self.norm(x))

with tempfile.TemporaryDirectory() as d:
    s = ProbeSession(ProbeConfig(bundle=d, part="p"))
    with ModelCapture(LM(), s) as cap:
        cap.begin_request("r")
        cap.model(torch.ones(1, 3, 4))
    s.close()
    assert s.report()["captured"] == 2 + 2 + 1 + 1, s.report()
print("ok")
"""


def test_imports_and_captures_without_transformers() -> None:
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
