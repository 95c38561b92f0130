"""Token alignment across DP attention (validator/runs/token_align.py): each DP rank runs its own batch, so
its ``input_ids`` / ``positions`` / ``seq_lens`` / ``rids`` and its attention-side tensors are its own (a
tensor coordinate ``dp=<rank>``, rids under the manifest's ``dp_rids``), while a tensor after DP attention's
gather holds every DP rank's rows in DP-rank order (no ``dp`` coordinate). The runs are built here as views of
the shape the reader gives; a run with DP attention pairs token by token with one without it."""

from __future__ import annotations

from typing import Any

import torch

from probes.core.shards import Coords, ShardSpec
from validator.runs.token_align import align_views, merge_runs, token_sequences
from validator.runs.view import RunView, TensorRef

VOCAB, H = 11, 4
PROMPTS = {"p0": [5, 7, 2, 9, 4, 1], "p1": [3, 3, 8, 6]}
DECODED = {"p0": [6, 10], "p1": [2, 5]}
FULL = {r: PROMPTS[r] + DECODED[r] for r in PROMPTS}
EMB = torch.randn(VOCAB, H, generator=torch.Generator().manual_seed(1))

# per step, per DP rank (None: no DP attention), the batch: (rid, first position, tokens)
DP_RUN = [
    {0: [("p0", 0, 6)], 1: [("p1", 0, 2)]},  # p1 chunked on DP rank 1
    {0: [("p0", 6, 1)], 1: [("p1", 2, 2)]},
    {0: [("p0", 7, 1)], 1: [("p1", 4, 1)]},
    {0: [], 1: [("p1", 5, 1)]},  # DP rank 0 idle: an empty batch
]
FLAT_RUN = [
    {None: [("p0", 0, 6), ("p1", 0, 4)]},
    {None: [("p1", 4, 1), ("p0", 6, 1)]},
    {None: [("p0", 7, 1), ("p1", 5, 1)]},
]


def _ref(name: str, value: torch.Tensor, **coords: Any) -> TensorRef:
    v = value.contiguous()
    return TensorRef(name=name, coords=Coords.make(**coords), shard=ShardSpec.full(), dtype=str(v.dtype).removeprefix("torch."),
                     shape=tuple(v.shape), sha256=None, nbytes=v.numel() * v.element_size(), origin=f"{name} {coords}",
                     loader=lambda: v)  # fmt: skip


def _hidden(ids: list[int], pos: list[int]) -> torch.Tensor:
    return EMB[ids] * (1 + torch.tensor(pos, dtype=torch.float32)[:, None] / 10)


def _run(
    name: str, steps: list[dict[int | None, list[tuple[str, int, int]]]], *, gathered: bool = True, offset: int = 0
) -> RunView:
    """The view of one run: per step and DP rank its aux fields and ``hidden`` (``t h``, attention side);
    ``mlp_out`` (twice ``hidden``) the step's rows of every DP rank, gathered in DP-rank order."""
    refs: list[TensorRef] = []
    rids: dict[str, list[str]] = {}
    dp_rids: dict[str, dict[str, list[str]]] = {}
    for step, per_dp in enumerate(steps):
        rows = []
        for dp, batch in per_dp.items():
            ids = [FULL[r][p + i] for r, p, n in batch for i in range(n)]
            pos = [p + i for r, p, n in batch for i in range(n)]
            c: dict[str, Any] = {"step": step + offset, "dp": dp}
            refs += [
                _ref("input_ids", torch.tensor(ids, dtype=torch.int64), **c),
                _ref("positions", torch.tensor(pos, dtype=torch.int64), **c),
                _ref("seq_lens", torch.tensor([p + n for _, p, n in batch], dtype=torch.int64), **c),
                _ref("hidden", _hidden(ids, pos).reshape(len(ids), H), layer=0, **c),
            ]
            names = [f"{name}-{r}" for r, _, _ in batch]
            if dp is None:
                rids[str(step + offset)] = names
            else:
                dp_rids.setdefault(str(step + offset), {})[str(dp)] = names
            rows.append(_hidden(ids, pos).reshape(len(ids), H))
        if gathered:
            refs.append(_ref("mlp_out", 2 * torch.cat(rows), step=step + offset, layer=0))
    manifest = {
        "sglang_dumper": {
            "dims": {"hidden": "t h # dp:=attn_dp", "mlp_out": "t h # tp:replicated"},
            "rids": rids,
            "dp_rids": dp_rids,
        }
    }
    return RunView(name=name, source="sglang-dumper", location=name, manifest=manifest, tensors=refs)


def _want(prompt: str, n: int) -> torch.Tensor:
    return _hidden(FULL[prompt][:n], list(range(n)))


def test_each_dp_rank_s_batch_is_keyed_by_its_own_fields() -> None:
    seqs, problems = token_sequences(_run("dp", DP_RUN))
    assert problems == []
    assert {k: s.ids for k, s in seqs.items()} == {"dp-p0": FULL["p0"], "dp-p1": FULL["p1"]}
    # a step's rows run over its DP ranks in order: step 0 is p0's 6 rows, then p1's 2
    assert seqs["dp-p1"].rows == [(0, 6), (0, 7), (1, 1), (1, 2), (2, 1), (3, 0)]
    assert seqs["dp-p0"].rows[-2:] == [(1, 0), (2, 0)]


def test_a_dp_attention_run_pairs_token_by_token_with_one_without() -> None:
    a, b = align_views(_run("flat", FLAT_RUN), _run("dp", DP_RUN))
    report = b.manifest["token_alignment"]
    assert [(r["a"], r["b"], r["tokens"]) for r in report["requests"]] == [
        ("flat-p0", "dp-p0", 8),
        ("flat-p1", "dp-p1", 6),
    ]
    assert report["unmatched"] == report["problems"] == report["left_out"] == []
    labels = {t.coords.label() for t in b.tensors}
    assert {t.coords.label() for t in a.tensors} == labels  # no dp coordinate left
    assert all("dp=" not in x for x in labels) and len(b.tensors) == 4
    for ta, tb in zip(
        sorted(a.tensors, key=lambda t: (t.name, t.coords.label())),
        sorted(b.tensors, key=lambda t: (t.name, t.coords.label())),
        strict=True,
    ):
        assert (ta.name, ta.coords, ta.shape) == (tb.name, tb.coords, tb.shape)
        rid = ta.coords.request.removeprefix("flat-")
        want = _want(rid, ta.shape[0]) * (2 if ta.name == "mlp_out" else 1)
        assert torch.equal(ta.load(), want) and torch.equal(tb.load(), want)


def test_a_changed_row_on_one_dp_rank_changes_only_its_request() -> None:
    dp = _run("dp", DP_RUN)
    i = next(
        i
        for i, t in enumerate(dp.tensors)
        if t.name == "hidden" and t.coords.step == 1 and ("dp", "1") in t.coords.extra
    )
    x = dp.tensors[i].load().clone()
    x[1] += 1.0  # p1's position 3, on DP rank 1
    dp.tensors[i] = _ref("hidden", x, step=1, layer=0, dp=1)
    a, b = align_views(_run("flat", FLAT_RUN), dp)
    got = {
        (t.name, t.coords.request): torch.equal(t.load(), u.load()) for t, u in zip(a.tensors, b.tensors, strict=True)
    }
    assert got == {
        ("hidden", "flat-p0"): True,
        ("hidden", "flat-p1"): False,
        ("mlp_out", "flat-p0"): True,
        ("mlp_out", "flat-p1"): True,
    }


def test_a_gathered_tensor_of_the_wrong_size_is_left_out() -> None:
    dp = _run("dp", DP_RUN)
    dp.tensors = [t if t.name != "mlp_out" or t.coords.step != 2 else _ref("mlp_out", torch.zeros(1, H), step=2, layer=0)
                  for t in dp.tensors]  # fmt: skip
    _, b = align_views(_run("flat", FLAT_RUN), dp)
    assert b.manifest["token_alignment"]["left_out"] == ["mlp_out [layer=0]: no token dimension of the steps' sizes"]
    assert {t.name for t in b.tensors} == {"hidden"}


def test_dp_rids_follow_their_steps_when_folders_are_merged() -> None:
    # a disaggregated run: the prefill server with DP attention, the decode server without
    prefill = [{0: [("p0", 0, 6)], 1: [("p1", 0, 2)]}, {0: [], 1: [("p1", 2, 2)]}]
    decode: list[dict[int | None, list[tuple[str, int, int]]]] = [
        {None: [("p0", 6, 1), ("p1", 4, 1)]},
        {None: [("p0", 7, 1), ("p1", 5, 1)]},
    ]
    merged = merge_runs([_run("pd", prefill), _run("pd", decode)], "pd", "pd")
    info = merged.manifest["sglang_dumper"]
    assert info["dp_rids"] == {"0": {"0": ["pd-p0"], "1": ["pd-p1"]}, "1": {"0": [], "1": ["pd-p1"]}}
    assert info["rids"] == {"2": ["pd-p0", "pd-p1"], "3": ["pd-p0", "pd-p1"]}
    seqs, problems = token_sequences(merged)
    assert problems == [] and {k: s.ids for k, s in seqs.items()} == {"pd-p0": FULL["p0"], "pd-p1": FULL["p1"]}
    a, b = align_views(_run("flat", FLAT_RUN), merged)
    assert [(r["b"], r["tokens"]) for r in b.manifest["token_alignment"]["requests"]] == [("pd-p0", 8), ("pd-p1", 6)]
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert ta.coords == tb.coords and torch.equal(ta.load(), tb.load())
