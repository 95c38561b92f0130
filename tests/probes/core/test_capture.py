"""The probe session on the CPU: capture, summary mode, filters, budget, configuration, read-only-ness."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from probes.core.capture import (
    DISABLED,
    ProbeError,
    ProbeSession,
    ProbeWarning,
    get_session,
    session_from_env,
    set_session,
)
from probes.core.config import ProbeConfig, ProbeConfigError, glob_match, parse_bytes
from probes.core.shards import ShardSpec
from probes.core.summary import CHECKSUM_BITS, CHECKSUM_PERIOD, SUMMARY_FIELDS, describe, summarize


def read_part(root: Path, part: str = "part0") -> tuple[dict[str, Any], list[tuple[dict[str, Any], torch.Tensor]]]:
    pdir = root / "parts" / part
    meta = json.loads((pdir / "part.json").read_text())
    files: dict[str, dict[str, torch.Tensor]] = {}
    out = []
    for rec in meta["tensors"]:
        if rec["file"] not in files:
            files[rec["file"]] = load_file(str(pdir / rec["file"]))
        out.append((rec, files[rec["file"]][rec["key"]]))
    return meta, out


def session(tmp_path: Path, **kw: Any) -> ProbeSession:
    return ProbeSession(ProbeConfig(bundle=str(tmp_path / "b"), **kw))


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# -- numpy float64 reference for summary mode -------------------------------------------------------
def np_values(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.bfloat16, torch.float16) or t.dtype.is_floating_point and t.element_size() == 1:
        return t.float().numpy().astype(np.float64).reshape(-1)  # exact widening
    return t.numpy().astype(np.float64).reshape(-1)


def np_checksum(t: torch.Tensor) -> int:
    flat = t.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    words = flat.view(torch.int8 if flat.element_size() == 1 else torch.int16).numpy().astype(np.int64)
    weights = np.arange(words.size, dtype=np.int64) % CHECKSUM_PERIOD + 1
    return sum(int(x) for x in np.add.reduceat(words * weights, np.arange(0, words.size, 1 << 20))) % (
        1 << CHECKSUM_BITS
    )


def np_summary(t: torch.Tensor) -> list[float]:
    x = np_values(t)
    with np.errstate(invalid="ignore", over="ignore"):
        return [
            float(np.sqrt(np.sum(x * x))),
            float(np.max(np.abs(x))),
            float(np.mean(x)),
            float(np.sum(~np.isfinite(x))),
            float(np_checksum(t)),
        ]


def assert_summary(got: torch.Tensor, t: torch.Tensor, rtol: float = 1e-9) -> None:
    ref = np_summary(t)
    g = got.tolist()
    assert got.dtype == torch.float64 and got.shape == (5,)
    for i, field in enumerate(SUMMARY_FIELDS):
        if math.isnan(ref[i]):
            assert math.isnan(g[i]), field
        elif math.isinf(ref[i]):
            assert g[i] == ref[i], field
        elif field == "mean":
            scale = float(np.mean(np.abs(np_values(t)))) or 1.0
            assert abs(g[i] - ref[i]) <= rtol * scale, (field, g[i], ref[i])
        elif field in ("nonfinite", "checksum", "absmax"):
            assert g[i] == ref[i], (field, g[i], ref[i])
        else:
            assert g[i] == pytest.approx(ref[i], rel=rtol), (field, g[i], ref[i])


FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("chunk", [1 << 22, 1000])
def test_summary_matches_numpy_float64(dtype: torch.dtype, chunk: int) -> None:
    t = (torch.randn(257, 96, generator=torch.Generator().manual_seed(1)) * 3 + 0.5).to(dtype)
    assert_summary(summarize(t, chunk=chunk), t)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.float8_e4m3fn])
def test_summary_other_dtypes(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    t = torch.randn(33, 7, generator=g).mul(20)
    t = t.gt(0) if dtype == torch.bool else t.clamp(0 if dtype == torch.uint8 else -400, 400).to(dtype)
    assert_summary(summarize(t), t)


def test_summary_non_finite_and_empty() -> None:
    t = torch.tensor([1.0, float("nan"), -float("inf"), 2.0], dtype=torch.bfloat16)
    s = describe(summarize(t))
    assert math.isnan(s["norm"]) and math.isnan(s["absmax"]) and math.isnan(s["mean"]) and s["nonfinite"] == 2
    t = torch.tensor([1.0, float("inf"), -3.0])
    s = describe(summarize(t))
    assert s["norm"] == math.inf and s["absmax"] == math.inf and s["nonfinite"] == 1
    assert_summary(summarize(t), t)
    e = summarize(torch.empty(0, 4))
    assert e[[0, 1, 3, 4]].tolist() == [0, 0, 0, 0] and math.isnan(e[2].item())


@pytest.mark.parametrize("chunk", [1 << 24, CHECKSUM_PERIOD, 2 * CHECKSUM_PERIOD + 5, 1000])
def test_checksum_chunking_matches_numpy(chunk: int) -> None:
    # several checksum chunks (whole 65536-word periods) plus a ragged tail
    t = torch.randint(-128, 127, (CHECKSUM_PERIOD * 5 + 12345,), dtype=torch.int8, generator=torch.Generator())
    assert summarize(t, chunk=chunk)[4].item() == np_checksum(t)


def test_checksum_is_deterministic_and_position_sensitive() -> None:
    t = torch.randn(64, 128).to(torch.bfloat16)
    base = summarize(t)[4].item()
    assert summarize(t.t().contiguous().t())[4].item() == base  # same values, other strides
    assert summarize(t.clone(), chunk=7)[4].item() == base
    u = t.clone()
    u.view(torch.int16)[3, 5] += 1  # one ulp
    assert summarize(u)[4].item() != base
    swapped = t[[1, 0, *range(2, 64)]]
    assert summarize(swapped)[4].item() != base  # a plain sum of bit patterns would miss this


# -- capture and the bundle -------------------------------------------------------------------------
@pytest.mark.parametrize("drain", ["thread", "inline"])
def test_full_capture_round_trip(tmp_path: Path, drain: str) -> None:
    s = session(tmp_path, drain=drain)
    a = torch.randn(4, 8).to(torch.bfloat16)
    b = torch.arange(12, dtype=torch.int32).reshape(3, 4)[:, ::2]
    s.set_coords(step=3, request="r1")
    s.capture("ctx.pre_norm", a, layer=19, shard=ShardSpec.partial(0, 8))
    s.capture("ids", b, tp_rank=1)
    s.close()
    meta, items = read_part(tmp_path / "b")
    (r0, t0), (r1, t1) = items
    assert r0["name"] == "ctx.pre_norm" and r0["coords"] == {"step": 3, "request": "r1", "layer": 19}
    assert r0["shard"] == {"kind": "partial", "index": 0, "count": 8}
    assert raw(t0) == raw(a) and t1.tolist() == b.tolist() and r1["coords"]["tp_rank"] == 1
    assert meta["extra"]["probe"]["captured"] == 2 and meta["extra"]["probe"]["write_errors"] == 0


def test_summary_mode_stores_summary_tensor(tmp_path: Path) -> None:
    s = session(tmp_path, mode="summary")
    x = torch.randn(16, 32).to(torch.bfloat16)
    s.capture("h", x, step=0, layer=2)
    s.close()
    meta, [(rec, t)] = read_part(tmp_path / "b")
    assert rec["name"] == "h.summary" and rec["shape"] == [5] and rec["dtype"] == "float64"
    assert rec["coords"] == {"step": 0, "layer": 2}
    assert_summary(t, x)
    assert meta["extra"]["probe"]["summary_fields"] == list(SUMMARY_FIELDS)


VIEWS = {
    "contiguous": lambda b: b,
    "transposed": lambda b: b.t(),
    "strided": lambda b: b[1::2, ::3],
    "narrow": lambda b: b.narrow(1, 2, 5),
}


@pytest.mark.parametrize("mode", ["full", "summary"])
@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_capture_never_modifies_the_tensor(tmp_path: Path, mode: str, view: str, dtype: torch.dtype) -> None:
    base = torch.randn(12, 10).to(dtype)
    t = VIEWS[view](base)
    before_base, before_view = raw(base), raw(t)
    shape, stride, version = t.shape, t.stride(), t._version
    s = session(tmp_path, mode=mode, tokens=(1, 4))
    s.capture("x", t, step=0)
    s.close()
    assert raw(base) == before_base and raw(t) == before_view
    assert (t.shape, t.stride(), t._version) == (shape, stride, version)
    _, [(rec, stored)] = read_part(tmp_path / "b")
    assert rec["coords"]["tokens"] == [1, 4]
    if mode == "full":
        assert raw(stored) == raw(t[1:4])


def test_filters_names_steps_requests(tmp_path: Path) -> None:
    s = session(tmp_path, names=("ctx.*", "**.mlp.output"), steps=((0, 1), (5, 5)), requests=frozenset({"a"}))
    x = torch.ones(2)
    s.capture("ctx.pre_norm", x, step=0, request="a")
    s.capture("ctx.pre_norm.deep", x, step=1, request="a")  # * is one component
    s.capture("layers.3.mlp.output", x, step=5, request="a")
    s.capture("ctx.pre_norm", x, step=2, request="a")  # step
    s.capture("ctx.pre_norm", x, step=1, request="b")  # request
    s.capture("ctx.post", x, request="a")  # no step while steps are filtered
    s.close()
    meta, items = read_part(tmp_path / "b")
    assert [(r["name"], r["coords"]["step"]) for r, _ in items] == [("ctx.pre_norm", 0), ("layers.3.mlp.output", 5)]
    assert meta["extra"]["probe"]["filtered"] == 4


def test_token_window_slices_rows_and_records_coords(tmp_path: Path) -> None:
    s = session(tmp_path, tokens=(10, 20), token_dim=1)
    x = torch.arange(2 * 32).reshape(2, 32)
    s.capture("a", x, step=0)  # rows are positions 0..31 -> 10..19
    s.capture("b", x[:, :8], step=0, tokens=(16, 24))  # positions 16..23 -> 16..19
    s.capture("c", x[:, :8], step=0, tokens=(30, 38))  # outside the window: filtered
    s.capture("d", torch.tensor(1.0), step=0)  # no token dim: captured whole
    with pytest.raises(ProbeError, match="spans 4 positions"):
        s.capture("e", x[:, :8], step=0, tokens=(0, 4))
    s.close()
    _, items = read_part(tmp_path / "b")
    got = {r["name"]: (r["coords"].get("tokens"), t) for r, t in items}
    assert got["a"][0] == [10, 20] and torch.equal(got["a"][1], x[:, 10:20])
    assert got["b"][0] == [16, 20] and torch.equal(got["b"][1], x[:, :4])
    assert "c" not in got and got["d"][0] is None


def test_budget_stops_capture_counts_and_warns_once(tmp_path: Path) -> None:
    s = session(tmp_path, budget_bytes=100)
    x = torch.zeros(10)  # 40 bytes
    s.capture("x", x, step=0)
    s.capture("x", x, step=1)
    with pytest.warns(ProbeWarning, match="budget") as rec:
        s.capture("x", x, step=2)  # 120 > 100 bytes
    for i in range(3, 5):  # no second warning (warnings are errors here)
        s.capture("x", x, step=i)
    s.capture("small", torch.zeros(1), step=0)  # stopped: even a small one is dropped
    s.close()
    assert len(rec) == 1
    meta, items = read_part(tmp_path / "b")
    assert len(items) == 2
    p = meta["extra"]["probe"]
    assert (p["captured"], p["dropped_captures"], p["dropped_bytes"], p["budget_exhausted"]) == (2, 4, 124, True)


def test_write_errors_are_counted_and_reported(tmp_path: Path) -> None:
    s = session(tmp_path)
    s.capture("x", torch.ones(2), step=0)
    s.capture("x", torch.ones(2), step=0)  # same name and coords: the writer refuses it
    with pytest.warns(ProbeWarning, match="could not be written"):
        s.close()
    meta, items = read_part(tmp_path / "b")
    assert len(items) == 1 and meta["extra"]["probe"]["write_errors"] == 1
    assert "already added" in meta["extra"]["probe"]["first_write_error"]


def test_disabled_session_does_nothing(tmp_path: Path) -> None:
    assert get_session() is DISABLED and not DISABLED.enabled
    assert DISABLED.capture("not a valid name/", torch.ones(1)) is None  # not even the name is checked
    DISABLED.after_replay(step=0)
    DISABLED.close()
    off = ProbeSession(ProbeConfig(bundle=str(tmp_path / "b"), enabled=False))
    off.capture("x", torch.ones(1))
    off.close()
    assert not (tmp_path / "b").exists()
    assert session_from_env(environ={}) is DISABLED


def test_set_session_and_context(tmp_path: Path) -> None:
    s = session(tmp_path)
    prev = set_session(s)
    try:
        assert prev is DISABLED and get_session() is s
        with s.coords(step=7, request="q"):
            get_session().capture("x", torch.ones(1))
        s.capture("y", torch.ones(1), step=8)
    finally:
        set_session(None)
    with s:
        pass
    assert get_session() is DISABLED
    _, items = read_part(tmp_path / "b")
    assert [r["coords"] for r, _ in items] == [{"step": 7, "request": "q"}, {"step": 8}]
    with pytest.raises(ProbeError, match="closed"):
        s.capture("z", torch.ones(1))


def test_config_from_env_and_dict() -> None:
    env = {
        "VALIDATOR_PROBE_BUNDLE": "/data/run1",
        "VALIDATOR_PROBE_MODE": "summary",
        "VALIDATOR_PROBE_NAMES": "ctx.*, layers.*.mlp",
        "VALIDATOR_PROBE_STEPS": "0-3,10",
        "VALIDATOR_PROBE_REQUESTS": "a,b",
        "VALIDATOR_PROBE_TOKENS": "0:64",
        "VALIDATOR_PROBE_BUDGET": "512MiB",
        "VALIDATOR_PROBE_GRAPH_SLOTS": "1",
        "VALIDATOR_PROBE_DEFER_SUMMARIES": "yes",
        "VALIDATOR_PROBE_LABELS": "model=kimi-k3,side=P",
        "OTHER": "x",
    }
    c = ProbeConfig.from_env(environ=env)
    assert (c.bundle, c.mode, c.names, c.steps) == (
        "/data/run1",
        "summary",
        ("ctx.*", "layers.*.mlp"),
        ((0, 3), (10, 10)),
    )
    assert (c.requests, c.tokens, c.budget_bytes, c.graph_slots) == (frozenset({"a", "b"}), (0, 64), 512 << 20, True)
    assert c.defer_summaries and not ProbeConfig().defer_summaries
    assert dict(c.labels) == {"model": "kimi-k3", "side": "P"} and c.active
    assert c.wants_step(2) and c.wants_step(10) and not c.wants_step(4) and not c.wants_step(None)
    json.dumps(c.to_dict())
    assert ProbeConfig.from_dict({"steps": [1, [4, 6]], "budget_bytes": "none"}).steps == ((1, 1), (4, 6))
    assert ProbeConfig.from_dict({"budget_bytes": None}).budget_bytes is None
    with pytest.raises(ProbeConfigError, match="VALIDATOR_PROBE_MOED"):
        ProbeConfig.from_env(environ={"VALIDATOR_PROBE_MOED": "full"})
    for bad in (
        {"mode": "fast"},
        {"steps": "3-1"},
        {"tokens": "5:5"},
        {"budget_bytes": "12 parsecs"},
        {"snapshot": "maybe"},
    ):
        with pytest.raises(ProbeConfigError):
            ProbeConfig.from_dict(bad)
    assert parse_bytes("2GB") == 2 * 10**9 and parse_bytes(10) == 10


def test_glob_match() -> None:
    assert glob_match("layers.*.mlp", "layers.3.mlp") and not glob_match("layers.*.mlp", "layers.3.mlp.up")
    assert glob_match("**.mlp.output", "model.layers.3.mlp.output") and glob_match("ctx.?", "ctx.a")
    assert not glob_match("ctx.?", "ctx.ab") and glob_match("x[0]", "x[0]")


# -- sampling for always-on use -----------------------------------------------------------------------
def test_sampling_every_nth_step_and_hashed_requests(tmp_path: Path) -> None:
    import zlib

    s = session(tmp_path, step_every=4, request_every=3, mode="summary")
    x = torch.ones(3)
    requests = [f"req-{i}" for i in range(30)]
    for step in range(10):
        for r in requests[:3]:
            s.capture("x", x, step=step, request=r)
    for r in requests:
        s.capture("y", x, step=0, request=r)
    s.capture("z", x, request=requests[0])  # no step while steps are sampled: left out
    s.close()
    meta, items = read_part(tmp_path / "b")
    chosen = {r for r in requests if zlib.crc32(r.encode()) % 3 == 0}
    assert 0 < len(chosen) < len(requests)
    got = {(rec["name"], rec["coords"]["step"], rec["coords"]["request"]) for rec, _ in items}
    want = {("x.summary", st, r) for st in (0, 4, 8) for r in requests[:3] if r in chosen}
    want |= {("y.summary", 0, r) for r in chosen}
    assert got == want
    p = meta["extra"]["probe"]
    assert p["sampled_out"] == 30 + 30 + 1 - len(want) and p["filtered"] == 0
    assert p["sampling"]["step_every"] == 4 and p["sampling"]["request_every"] == 3
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["run"]["probe"] == p["sampling"]
    assert manifest["run"]["probe"]["mode"] == "summary" and "crc32" in manifest["run"]["probe"]["request_rule"]


def test_sampling_config() -> None:
    c = ProbeConfig.from_env(environ={"VALIDATOR_PROBE_STEP_EVERY": "100", "VALIDATOR_PROBE_REQUEST_EVERY": "8"})
    assert (c.step_every, c.request_every) == (100, 8)
    assert c.sampled(200, None) is False and ProbeConfig(step_every=100).sampled(200, None)
    assert not ProbeConfig(step_every=100).sampled(201, "a") and not ProbeConfig(step_every=2).sampled(None, "a")
    for bad in ({"step_every": 0}, {"request_every": "-1"}):
        with pytest.raises(ProbeConfigError):
            ProbeConfig.from_dict(bad)
    json.dumps(c.sampling())
