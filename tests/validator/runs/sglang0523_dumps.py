"""Writes dumps with the real dumper of SGLang 0.5.23 (``sglang/srt/debug_utils/dumper.py`` of the wheel that
scripts/setup unpacks into .venv/sglang-versions/0.5.23), run as a script: ``python sglang0523_dumps.py OUT
[all|tp|align|bench]`` (``tp`` and ``all`` fork the two gloo ranks of ``tp2-gloo``).

The dumper module is loaded from its file as ``sglang.srt.debug_utils.dumper``. Its imports outside torch
(pyzmq, ``sglang.srt.managers.io_struct``, ``sglang.srt.runtime_context``, ``sglang.srt.utils`` and the modules
its SGLang plugin reads) pull in SGLang's server stack, which is not installed; they are replaced by small
modules: ``runtime_context.get_parallel()`` returns the ranks this script plays, so the dumper's own plugin
writes ``sglang_parallel_info`` exactly as in a server. The HTTP control server stays off (``DUMPER_SERVER_PORT``
unset), so pyzmq is never used. Several ranks are played by one process in turn (the dumper asks
``torch.distributed`` for its rank; the script answers), file naming and metadata are the dumper's own.

A 2-layer MLP, two steps of 5 tokens (float32): per layer ``hidden`` (``t h # tp:replicated``), ``mlp_up``
(column parallel, ``t f[tp]``), ``mlp_down`` (row parallel before its all-reduce, ``t h[tp:partial]``),
``attn_q`` (``t (nh*hd)[tp]``), ``mlp_out`` (after the all-reduce, ``t h # tp:replicated``); ``logits`` without
dims; ``num_tokens`` (an int). Experiments (folders under OUT):

- ``tp1``: one rank; ``tp2``: TP 2 (attention and MoE groups the same as TP);
- ``tp2-gloo``: the same TP 2 model run by two processes in a gloo process group, the row-parallel partials
  all-reduced for real (``mlp_out``);
- ``tp2-bad``: TP 2 where rank 1's ``hidden`` of layer 1 is off by 1e-3, plus ``mlp_gate`` dumped as ``t f``
  (sharded, but the dims do not say so);
- ``tp2-dp2``: world 4, TP 2 x attention-DP 2, the batch on attention-DP rank 1 only (``# dp:=attn_dp``);
- ``tp2-w`` (``bench`` only): TP 2 with every weight element scaled by 1 + 0.01 N(0, 1);
- ``align-a`` / ``align-b``, and ``pd/pd-prefill`` + ``pd/pd-decode``: token-alignment captures, see ``ALIGN``.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SIDE = Path(__file__).resolve().parents[3] / ".venv" / "sglang-versions" / "0.5.23"
H, F, NH, HD, T, VOCAB = 16, 8, 4, 2, 5, 11

# Token alignment: two prompts (ids) and the batches each run made of them. A run is a list of steps; a step
# is a list of (rid, first position, number of tokens). align-a prefills both prompts in one batch, then
# decodes; align-b chunks prompt p0 in two, prefills p1 alone, then decodes both.
PROMPTS = {"p0": [5, 7, 2, 9, 4, 1], "p1": [3, 3, 8, 6]}
DECODED = {"p0": [6, 10], "p1": [2, 5]}
ALIGN = {
    "align-a": [[("p0", 0, 6), ("p1", 0, 4)], [("p0", 6, 1), ("p1", 4, 1)], [("p0", 7, 1), ("p1", 5, 1)]],
    "align-b": [[("p0", 0, 4)], [("p0", 4, 2)], [("p1", 0, 4)], [("p0", 6, 1), ("p1", 4, 1)], [("p1", 5, 1), ("p0", 7, 1)]],
    # prefill / decode disaggregation: two servers, two dumpers, one folder each under OUT/pd
    "pd-prefill": [[("p0", 0, 6)], [("p1", 0, 4)]],
    "pd-decode": [[("p0", 6, 1), ("p1", 4, 1)], [("p0", 7, 1), ("p1", 5, 1)]],
}


def embedding() -> torch.Tensor:
    """The token embedding every alignment run's ``hidden`` rows come from (``[VOCAB, H]``, float32)."""
    return torch.randn(VOCAB, H, generator=torch.Generator().manual_seed(1))


def expected_hidden(prompt: str, n: int | None = None) -> torch.Tensor:
    """The ``hidden`` rows of a request's first ``n`` tokens (all by default) as every alignment run writes them,
    in float64: the token's embedding row x (1 + position / 10)."""
    emb = embedding().double()
    ids = (PROMPTS[prompt] + DECODED[prompt])[:n]
    return emb[ids] * (1 + torch.arange(len(ids), dtype=torch.float64)[:, None] / 10)


def written_dumps(out: Path, *, layouts: bool = True) -> Path:
    """``out`` with this script's ``align`` runs and, with ``layouts``, those of token_align_dumps.py, written by
    the real dumper in subprocesses (for the tests' fixtures); the test is skipped where SGLang 0.5.23 is not
    unpacked (scripts/setup unpacks it)."""
    import subprocess

    import pytest

    if not (SIDE / "sglang").exists():
        pytest.skip(f"sglang 0.5.23 is not unpacked at {SIDE} (scripts/setup installs it)")
    here = Path(__file__).parent
    scripts = [("sglang0523_dumps.py", ["align"])] + ([("token_align_dumps.py", [])] if layouts else [])
    for script, args in scripts:
        got = subprocess.run(
            [sys.executable, str(here / script), str(out), *args], capture_output=True, text=True, timeout=120
        )
        assert got.returncode == 0, got.stderr[-3000:]
    return out


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []  # a package: submodules may be stubbed under it
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    return mod


PARALLEL: dict[str, Any] = {}


def load_dumper() -> Any:
    class _Opaque:  # stands for SGLang classes the plugin tests values against
        pass

    for name in ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.layers", "sglang.srt.model_executor",
                 "sglang.srt.debug_utils"):
        _stub(name)
    _stub("zmq")
    _stub("sglang.srt.managers.io_struct", sock_recv=None, sock_send=None, wrap_as_pickle=None)
    _stub("sglang.srt.runtime_context", get_parallel=lambda: types.SimpleNamespace(**PARALLEL),
          get_server_args=lambda: None, get_serving=lambda: None)
    _stub("sglang.srt.utils", get_device=lambda: "cpu")
    _stub("sglang.srt.distributed")
    _stub("sglang.srt.layers.dp_attention", get_moe_cp_size=lambda: 1,
          is_dp_attention_enabled=lambda: PARALLEL["attn_dp_size"] > 1)
    _stub("sglang.srt.layers.logits_processor", LogitsProcessorOutput=_Opaque)
    _stub("sglang.srt.model_executor.forward_batch_info", ForwardBatch=_Opaque, PPProxyTensors=_Opaque)
    path = SIDE / "sglang" / "srt" / "debug_utils" / "dumper.py"
    spec = importlib.util.spec_from_file_location("sglang.srt.debug_utils.dumper", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.dumper


def _play(dumper: Any, exp: str, rank: int, world: int, *, tp: tuple[int, int], attn_dp: tuple[int, int] = (0, 1),
          patch: bool = True) -> None:
    if patch:  # one process plays every rank; with a real process group the dumper asks it instead
        dist.is_initialized = lambda: True
        dist.get_rank = lambda group=None: rank
        dist.get_world_size = lambda group=None: world
    PARALLEL.clear()
    PARALLEL.update(tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, moe_ep_rank=0, moe_ep_size=1,
                    moe_tp_rank=tp[0], moe_tp_size=tp[1], moe_dp_rank=0, attn_tp_rank=tp[0], attn_tp_size=tp[1],
                    attn_dp_rank=attn_dp[0], attn_dp_size=attn_dp[1], attn_cp_rank=0, attn_cp_size=1)
    dumper.reset()
    dumper.__dict__.pop("_static_meta", None)  # computed once per process: once per played rank here
    dumper.configure(exp_name=exp)


def mlp_run(dumper: Any, exp: str, tp_size: int, *, bad: bool = False, attn_dp: int = 1, wnoise: float = 0.0,
            gloo: bool = False) -> None:
    world = tp_size * attn_dp
    for rank in [dist.get_rank()] if gloo else range(world):
        tp_rank, dp_rank = rank % tp_size, rank // tp_size
        _play(dumper, exp, rank, world, tp=(tp_rank, tp_size), attn_dp=(dp_rank, attn_dp), patch=not gloo)
        g = torch.Generator().manual_seed(0)
        w_up = [torch.randn(F, H, generator=g) for _ in range(2)]
        w_down = [torch.randn(H, F, generator=g) / 3 for _ in range(2)]
        w_q = [torch.randn(NH * HD, H, generator=g) for _ in range(2)]
        w_lm = torch.randn(VOCAB, H, generator=g)
        if wnoise:  # every weight element scaled by (1 + wnoise * N(0, 1)), from a generator of its own
            gw = torch.Generator().manual_seed(7)
            for w in (*w_up, *w_down, *w_q, w_lm):
                w.mul_(1 + wnoise * torch.randn(w.shape, generator=gw))
        fs, qs = slice(tp_rank * F // tp_size, (tp_rank + 1) * F // tp_size), slice(tp_rank * NH * HD // tp_size, (tp_rank + 1) * NH * HD // tp_size)
        for _step in range(2):
            x = torch.randn(T, H, generator=g)
            if attn_dp > 1 and dp_rank != attn_dp - 1:
                x = x[:0]  # this attention-DP rank has no request in the batch
            for layer in range(2):
                up = torch.relu(x @ w_up[layer][fs].T)
                partial = up @ w_down[layer][:, fs].T
                if gloo:  # the row-parallel all-reduce
                    full = partial.clone()
                    dist.all_reduce(full)
                else:  # what the all-reduce of the partials gives
                    full = torch.relu(x @ w_up[layer].T) @ w_down[layer].T
                seen = x + 1e-3 if bad and rank == 1 and layer == 1 else x
                dp = " dp:=attn_dp" if attn_dp > 1 else ""
                dumper.dump("hidden", seen, dims="t h # tp:replicated" + dp, layer_id=layer)
                dumper.dump("attn_q", (x @ w_q[layer][qs].T).clone(), dims="t (nh*hd)[tp]" + (" #" + dp if dp else ""), layer_id=layer)
                dumper.dump("mlp_up", up, dims="t f[tp]" + (" #" + dp if dp else ""), layer_id=layer)
                dumper.dump("mlp_down", partial, dims="t h[tp:partial]" + (" #" + dp if dp else ""), layer_id=layer)
                if bad:
                    dumper.dump("mlp_gate", up.clone(), dims="t f", layer_id=layer)
                dumper.dump("mlp_out", full, dims="t h # tp:replicated" + dp, layer_id=layer)
                x = x + full
            dumper.dump("logits", x @ w_lm.T)
            dumper.dump("num_tokens", T)
            dumper.step()


def align_run(dumper: Any, exp: str) -> None:
    """One rank. Per step the batch's ``input_ids``, ``positions``, ``seq_lens`` and ``rids`` (the names SGLang's
    non-intrusive dumper gives a ForwardBatch's fields) and ``hidden`` (``t h``): a function of the token id
    and its position only, so every batching gives each token the same row."""
    _play(dumper, exp, 0, 1, tp=(0, 1))
    emb = embedding()
    full = {r: PROMPTS[r] + DECODED[r] for r in PROMPTS}
    for batch in ALIGN[exp]:
        ids = [full[r][p + i] for r, p, n in batch for i in range(n)]
        pos = [p + i for r, p, n in batch for i in range(n)]
        hidden = emb[ids] * (1 + torch.tensor(pos, dtype=torch.float32)[:, None] / 10)
        dumper.dump("input_ids", torch.tensor(ids))
        dumper.dump("positions", torch.tensor(pos))
        dumper.dump("seq_lens", torch.tensor([p + n for _, p, n in batch]))
        names = [f"pd-{r}" if exp.startswith("pd-") else f"{exp}-{r}" for r, _, _ in batch]
        dumper.dump("rids", names)  # each run names its requests its own way; P and D of one run share them
        dumper.dump("hidden", hidden, dims="t h", layer_id=0)
        dumper.step()


def gloo_rank(out: str, rank: int) -> None:
    """One of the two processes of ``tp2-gloo``: a real gloo process group, the partials all-reduced."""
    os.environ.update(DUMPER_ENABLE="1", DUMPER_DIR=out, DUMPER_ENABLE_OUTPUT_CONSOLE="0")
    dist.init_process_group("gloo", init_method=f"file://{out}/.gloo-init", rank=rank, world_size=2)
    mlp_run(load_dumper(), "tp2-gloo", 2, gloo=True)
    dist.destroy_process_group()


def main(out: str, which: str = "all") -> None:
    os.environ.update(DUMPER_ENABLE="1", DUMPER_DIR=out, DUMPER_ENABLE_OUTPUT_CONSOLE="0")
    ranks = []
    if which in ("all", "tp"):  # the gloo ranks run while this process writes the rest
        os.makedirs(out, exist_ok=True)
        fork = multiprocessing.get_context("fork")  # torch is imported already: forked ranks start at once
        ranks = [fork.Process(target=gloo_rank, args=(out, r)) for r in range(2)]
        for p in ranks:
            p.start()
    dumper = load_dumper()
    if which in ("all", "tp"):
        mlp_run(dumper, "tp1", 1)
        mlp_run(dumper, "tp2", 2)
        mlp_run(dumper, "tp2-bad", 2, bad=True)
        mlp_run(dumper, "tp2-dp2", 2, attn_dp=2)
    if which in ("all", "bench"):
        mlp_run(dumper, "tp2-w", 2, wnoise=1e-2)
    if which in ("all", "align"):
        align_run(dumper, "align-a")
        align_run(dumper, "align-b")
        dumper.configure(dir=os.path.join(out, "pd"))
        align_run(dumper, "pd-prefill")
        align_run(dumper, "pd-decode")
    for p in ranks:
        p.join(timeout=120)
    if any(p.exitcode != 0 for p in ranks):
        raise SystemExit(f"a gloo rank failed: exit codes {[p.exitcode for p in ranks]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
