"""Forward hooks by module-name pattern on a plain torch.nn model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from probes.core.capture import DISABLED, ProbeSession
from probes.core.config import ProbeConfig
from probes.core.hooks import HookHandles, attach, layer_of


class Attn(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
        y = self.q(x)
        return y, None, y.sum(-1)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = Attn(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _, _ = self.attn(x)
        return x + self.mlp(x + a)


class Model(nn.Module):
    def __init__(self, d: int = 8, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def read(root: Path) -> dict[str, tuple[dict[str, Any], torch.Tensor]]:
    pdir = root / "parts" / "part0"
    meta = json.loads((pdir / "part.json").read_text())
    data = {f: load_file(str(pdir / f)) for f in {r["file"] for r in meta["tensors"]}}
    return {r["name"]: (r["coords"], data[r["file"]][r["key"]]) for r in meta["tensors"]}


@pytest.fixture
def model() -> Model:
    torch.manual_seed(0)
    return Model().eval()


def test_attach_captures_matching_module_outputs(tmp_path: Path, model: Model) -> None:
    s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "b")))
    x = torch.randn(5, 8)
    expected = {}
    ref_hooks = [
        model.layers[i].mlp.register_forward_hook(lambda m, a, o, i=i: expected.__setitem__(i, o.clone()))
        for i in range(3)
    ]
    handles = attach(model, s, patterns=["layers.*.mlp"], what="output", coords={"step": 0})
    assert isinstance(handles, HookHandles) and len(handles) == 3
    with torch.no_grad():
        model(x)
    for h in ref_hooks:
        h.remove()
    handles.remove()
    s.close()
    got = read(tmp_path / "b")
    assert sorted(got) == ["layers.0.mlp.output", "layers.1.mlp.output", "layers.2.mlp.output"]
    for i in range(3):
        coords, t = got[f"layers.{i}.mlp.output"]
        assert coords == {"step": 0, "layer": i} and torch.equal(t, expected[i])


def test_tuple_outputs_inputs_and_prefix(tmp_path: Path, model: Model) -> None:
    s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "b")))
    with attach(model, s, "layers.1.attn", what="both", prefix="tgt.", coords={"step": 2}), torch.no_grad():
        model(torch.randn(4, 8))
    s.close()
    got = read(tmp_path / "b")
    assert sorted(got) == ["tgt.layers.1.attn.input", "tgt.layers.1.attn.output[0]", "tgt.layers.1.attn.output[2]"]
    assert got["tgt.layers.1.attn.output[2]"][1].shape == (4,)


def test_hooks_do_not_change_outputs_and_remove_cleanly(tmp_path: Path, model: Model) -> None:
    x = torch.randn(6, 8).to(torch.bfloat16)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
        s = ProbeSession(ProbeConfig(bundle=str(tmp_path / "b"), mode="summary"))
        handles = attach(model, s, ["layers.*", "**.mlp.*"], what="both", coords={"step": 0})
        out = model(x)
        handles.remove()
        assert not any(m._forward_hooks for m in model.modules())
        model(x)  # no more captures
    s.close()
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    got = read(tmp_path / "b")
    assert "layers.2.mlp.2.output.summary" in got and len(got) == 3 * (2 + 3 * 2)


def test_unmatched_pattern_and_bad_what_raise(model: Model) -> None:
    with pytest.raises(ValueError, match=r"\['layer.\*.mlp'\] match no module"):
        attach(model, DISABLED, ["layers.*.mlp", "layer.*.mlp"])
    with pytest.raises(ValueError, match="what"):
        attach(model, DISABLED, ["layers.*.mlp"], what="grad")  # type: ignore[arg-type]


def test_disabled_session_hooks_are_inert(model: Model) -> None:
    calls = []

    class Spy:
        enabled = False

        def capture(self, *a: Any, **k: Any) -> None:
            calls.append(a)

    with attach(model, Spy(), ["layers.*.mlp"]), torch.no_grad():
        model(torch.randn(2, 8))
    assert calls == []


def test_layer_of() -> None:
    assert layer_of("model.layers.12.mlp") == 12 and layer_of("lm_head") is None and layer_of("3") == 3
