"""Writes token-alignment dumps in ``b s`` layouts with the real dumper of SGLang 0.5.23 (loaded as
tests/validator/runs/sglang0523_dumps.py loads it), run as a script: ``python token_align_dumps.py OUT``.

The prompts, the decoded tokens and the ``hidden`` rows (embedding row of the token x (1 + position / 10)) are
those of ``align-a`` / ``align-b`` there, so these runs pair token by token with them. Padding rows hold 1e3, so
a padding row taken for a token fails the comparison. Experiments (folders under OUT):

- ``bs-a``: both prompts prefilled as one ``[2, 6]`` batch, p1 right-padded, the padding marked by
  ``attention_mask`` (1 for a token, 0 for padding), then two ``[2, 1]`` decode steps; ``hidden`` dumped with
  dims ``b s h``, ``seq_lens`` dumped;
- ``bs-b``: p0 chunked (4 tokens alone, then 2 beside p1's 4, left-padded), decode steps in the other order;
  ``hidden`` dumped sequence-major (dims ``s b h``), the padding marked by position -1, no ``seq_lens`` and no
  ``attention_mask``;
- ``dp-a``: world 4, attention TP 2 x attention DP 2: DP rank 0 serves p0, DP rank 1 p1 (chunked; rank 0 idle,
  an empty batch, in the last step), each DP rank dumping its own batch's fields and ``rids``, its
  attention-side ``hidden`` (``t h # tp:replicated dp:=attn_dp``) and ``attn_q`` (``t (nh*hd)[tp] #
  dp:=attn_dp``), and ``mlp_out`` after DP attention's gather, every DP rank's rows in DP-rank order
  (``t h # tp:replicated attn_dp:replicated``);
- ``dp-ref``: the same three tensors on one rank, batched as ``align-a``;
- ``mg-thd``: Megatron's packed layout, one step: ``input_ids`` and ``position_ids`` ``[1, 16]`` holding p0's 8
  tokens, p1's 6 and 2 rows of padding, ``cu_seqlens_q`` (and ``cu_seqlens_kv``) ``[0, 8, 14, 14]``, ``hidden``
  sequence-first (``s b h``, ``[16, 1, h]``), no ``rids``;
- ``mg-bshd``: Megatron's ``[B, S]`` layout: p1's 6 tokens and p0's first 6 as two rows of ``input_ids``
  ``[2, 6]``, no ``position_ids`` (each row from position 0), ``hidden`` ``s b h``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.validator.runs.sglang0523_dumps import DECODED, PROMPTS, H, _play, embedding, load_dumper

PAD = 1e3
# a run is a list of steps; a step is a list of batch rows: (rid, first position, tokens, padding before it)
BS = {
    "bs-a": [[("p0", 0, 6, 0), ("p1", 0, 4, 0)], [("p0", 6, 1, 0), ("p1", 4, 1, 0)], [("p0", 7, 1, 0), ("p1", 5, 1, 0)]],
    "bs-b": [[("p0", 0, 4, 0)], [("p0", 4, 2, 2), ("p1", 0, 4, 0)], [("p1", 4, 1, 0), ("p0", 6, 1, 0)],
             [("p0", 7, 1, 0), ("p1", 5, 1, 0)]],
}  # fmt: skip


def bs_run(dumper: Any, exp: str) -> None:
    _play(dumper, exp, 0, 1, tp=(0, 1))
    emb = embedding()
    full = {r: PROMPTS[r] + DECODED[r] for r in PROMPTS}
    for batch in BS[exp]:
        s = max(pad + n for _, _, n, pad in batch)
        ids = torch.zeros(len(batch), s, dtype=torch.int64)
        pos = torch.full((len(batch), s), -1 if exp == "bs-b" else 0, dtype=torch.int64)
        mask = torch.zeros(len(batch), s, dtype=torch.int64)
        hidden = torch.full((len(batch), s, H), PAD)
        for i, (r, p, n, pad) in enumerate(batch):  # right padding after the tokens, left padding before them
            cols = slice(pad, pad + n)
            ids[i, cols] = torch.tensor(full[r][p : p + n])
            pos[i, cols] = torch.arange(p, p + n)
            mask[i, cols] = 1
            hidden[i, cols] = emb[ids[i, cols]] * (1 + pos[i, cols].float()[:, None] / 10)
        dump = dumper.dump
        dump("input_ids", ids)
        dump("positions", pos)
        if exp == "bs-a":
            dump("attention_mask", mask)
            dump("seq_lens", torch.tensor([p + n for _, p, n, _ in batch]))
            dump("hidden", hidden, dims="b s h", layer_id=0)
        else:
            dump("hidden", hidden.transpose(0, 1).contiguous(), dims="s b h", layer_id=0)
        dump("rids", [f"{exp}-{r}" for r, _, _, _ in batch])
        dumper.step()


# per step, per DP rank: (rid, first position, tokens)
DP = [[[("p0", 0, 6)], [("p1", 0, 2)]], [[("p0", 6, 1)], [("p1", 2, 2)]], [[("p0", 7, 1)], [("p1", 4, 1)]],
      [[], [("p1", 5, 1)]]]  # fmt: skip
DP_REF = [[[("p0", 0, 6), ("p1", 0, 4)]], [[("p0", 6, 1), ("p1", 4, 1)]], [[("p0", 7, 1), ("p1", 5, 1)]]]
NQ = 8  # attn_q columns, split over the attention TP ranks


def dp_run(dumper: Any, exp: str) -> None:
    steps = DP if exp == "dp-a" else DP_REF
    dp_size, tp_size = len(steps[0]), 2 if exp == "dp-a" else 1
    emb = embedding()
    w_q = torch.randn(NQ, H, generator=torch.Generator().manual_seed(2))
    full = {r: PROMPTS[r] + DECODED[r] for r in PROMPTS}

    def rows(batch: list[tuple[str, int, int]]) -> tuple[list[int], list[int], torch.Tensor]:
        ids = [full[r][p + i] for r, p, n in batch for i in range(n)]
        pos = [p + i for _, p, n in batch for i in range(n)]
        return ids, pos, (emb[ids] * (1 + torch.tensor(pos, dtype=torch.float32)[:, None] / 10)).reshape(len(ids), H)

    for rank in range(dp_size * tp_size):
        tp, dp = rank % tp_size, rank // tp_size
        _play(dumper, exp, rank, dp_size * tp_size, tp=(tp, tp_size), attn_dp=(dp, dp_size))
        q = slice(tp * NQ // tp_size, (tp + 1) * NQ // tp_size)
        decl = " dp:=attn_dp" if dp_size > 1 else ""
        for per_dp in steps:
            ids, pos, hidden = rows(per_dp[dp])
            dumper.dump("input_ids", torch.tensor(ids, dtype=torch.int64))
            dumper.dump("positions", torch.tensor(pos, dtype=torch.int64))
            dumper.dump("seq_lens", torch.tensor([p + n for _, p, n in per_dp[dp]], dtype=torch.int64))
            dumper.dump("rids", [f"{exp}-{r}" for r, _, _ in per_dp[dp]])
            dumper.dump("hidden", hidden, dims="t h # tp:replicated" + decl, layer_id=0)
            dumper.dump("attn_q", (hidden @ w_q[q].T).contiguous(), dims="t (nh*hd)[tp]" + (" #" + decl if decl else ""),
                        layer_id=0)  # fmt: skip
            gathered = torch.cat([rows(b)[2] for b in per_dp])  # every DP rank's rows, in DP-rank order
            dumper.dump("mlp_out", 2 * gathered, dims="t h # tp:replicated" + (" attn_dp:replicated" if decl else ""),
                        layer_id=0)  # fmt: skip
            dumper.step()


def megatron_run(dumper: Any, exp: str) -> None:
    _play(dumper, exp, 0, 1, tp=(0, 1))
    emb = embedding()
    seqs = [PROMPTS[r] + DECODED[r] for r in ("p0", "p1")] if exp == "mg-thd" else [
        (PROMPTS["p1"] + DECODED["p1"]), PROMPTS["p0"]]  # fmt: skip
    rows = [(t, p) for seq in seqs for p, t in enumerate(seq)]
    hidden = torch.stack([emb[t] * (1 + p / 10) for t, p in rows])
    if exp == "mg-thd":
        pad = 2
        ids = torch.tensor([t for t, _ in rows] + [0] * pad)[None]
        dumper.dump("input_ids", ids)
        dumper.dump("position_ids", torch.tensor([p for _, p in rows] + [0] * pad)[None])
        cu = torch.tensor([0, len(seqs[0]), len(rows), len(rows)], dtype=torch.int32)
        dumper.dump("cu_seqlens_q", cu)
        dumper.dump("cu_seqlens_kv", cu.clone())
        dumper.dump("hidden", torch.cat([hidden, torch.full((pad, H), PAD)])[:, None], dims="s b h", layer_id=0)
    else:
        dumper.dump("input_ids", torch.tensor([t for t, _ in rows]).reshape(2, 6))
        dumper.dump("hidden", hidden.reshape(2, 6, H).transpose(0, 1).contiguous(), dims="s b h", layer_id=0)
    dumper.step()


def main(out: str) -> None:
    os.environ.update(DUMPER_ENABLE="1", DUMPER_DIR=out, DUMPER_ENABLE_OUTPUT_CONSOLE="0")
    dumper = load_dumper()
    for exp in BS:
        bs_run(dumper, exp)
    for exp in ("dp-a", "dp-ref"):
        dp_run(dumper, exp)
    for exp in ("mg-thd", "mg-bshd"):
        megatron_run(dumper, exp)


if __name__ == "__main__":
    main(sys.argv[1])
