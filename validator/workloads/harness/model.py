"""A reference speculative-decoding harness: a tiny seeded target LM, a draft fed by a context projection,
greedy block verification, and per-verify-step acceptance records. Needs torch only.

The target is a residual MLP language model over bytes. The input for a position is the embeddings of
the last ``window`` tokens plus a slow *memory* (an exponentially decayed sum of the embeddings of every
token so far, prompt and output); ``layers`` residual MLP blocks follow, grouped into ``stages`` pipeline
stages. The residual stream is a sum, so the final hidden state is exactly the sum of the per-stage
contributions (stage 0 also owns the input projection); those contributions are the draft's *context
features*.

The draft works like a DFlash/EAGLE head in miniature. It owns a noised copy of the target (every weight
perturbed by ``draft_noise``) whose memory is frozen at the end of the prompt: it cannot follow the
target's long-range state. For each verify step it takes the context of the last verified position,
``c = fc @ concat(features)`` with ``fc = [P, P, ..., P]`` (``P`` orthogonal), maps it back with ``P`` to
the target's hidden state there, and corrects its own estimate for every position it proposes by the
error it made at that verified position. How ``c`` is computed is the switch under test:

- ``d-only``: one float32 GEMM over the concatenated features (the D node holds every feature);
- ``pd``: one bf16 GEMM per stage added into a bf16 running sum handed from stage to stage (the PD / PP
  partial-projection path) - a real, small rounding difference;
- ``pd-broken``: as ``pd`` but one stage's contribution never arrives - a real bug, a large drop.

Measured with the defaults (seed 0, block 4, 200 tokens after GSM8K 5-shot prompts): accepted drafts per
verify step 1.67 d-only, 1.67 pd, 0.93 pd-broken, and 1.50 for a draft that ignores the context
(``draft_context=False``): the context helps, a wrong one is worse than none.

Verification is greedy: the target scores the verified window and every drafted prefix in one batch, the
longest prefix of drafts equal to the target's argmax is accepted, and the target's token after it is
emitted as the bonus. Outputs are therefore identical in every mode; only acceptance changes. As in
SGLang, the first output token comes from prefill (no verify step), so ``completion_tokens / verify steps``
counts it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "BOS",
    "EOS",
    "MODES",
    "Harness",
    "HarnessConfig",
    "SpecCounters",
    "prompt_hash",
    "spec_counters",
    "write_acceptance_part",
]

MODES = ("d-only", "pd", "pd-broken")
EOS = 256  # the byte vocabulary is 0..255; EOS is an output token, BOS only pads windows
BOS = 257
OUT_VOCAB = 257
IN_VOCAB = 258


@dataclass(frozen=True)
class HarnessConfig:
    """Shapes and the knobs that set how good the draft is. Defaults (seed 0, block 4): accept length
    (bonus included) about 2.7 in d-only and pd, about 1.9 in pd-broken; about 1 ms per output token on one
    CPU core (use ``torch.set_num_threads(1)``: these ops are too small for threads)."""

    window: int = 8  # tokens the LM looks at
    embed: int = 32
    hidden: int = 96
    layers: int = 6
    stages: int = 3  # pipeline stages; layers are split evenly
    memory_decay: float = 0.9  # the target's slow state: sum of decay**age * embedding over all tokens
    memory_gain: float = 0.5  # its weight in the input (above ~1 greedy outputs fall into repetition)
    later_scale: float = 0.6  # output scale of the layers after stage 0
    draft_noise: float = 0.03  # relative noise on the draft's copy of the target's weights
    draft_context: bool = True  # False: the draft ignores the context (to measure what the context is worth)
    broken_stage: int = -1  # the stage whose contribution is missing in "pd-broken" mode (-1: the last)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:16]


def _rmsnorm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class _Weights:
    """The target's weights, seeded, plus the draft's noised copies and the projection ``P``."""

    def __init__(self, cfg: HarnessConfig, seed: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(seed)

        def rnd(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=g, dtype=torch.float32) * scale

        d, e = cfg.hidden, cfg.embed
        n_in = (cfg.window + 1) * e
        self.emb = rnd(IN_VOCAB, e, scale=1.0)
        self.w_in = rnd(n_in, d, scale=1.0 / math.sqrt(n_in))
        self.up = [rnd(d, 2 * d, scale=1.0 / math.sqrt(d)) for _ in range(cfg.layers)]
        self.down = [rnd(2 * d, d, scale=1.0 / math.sqrt(2 * d)) for _ in range(cfg.layers)]
        self.head = rnd(OUT_VOCAB, d, scale=1.0)
        q, _ = torch.linalg.qr(rnd(d, d, scale=1.0))
        self.proj = q  # P, orthogonal: c = f @ P.T, f = c @ P
        n = cfg.draft_noise
        self.d_emb = self.emb + rnd(IN_VOCAB, e, scale=n)
        self.d_w_in = self.w_in + rnd(n_in, d, scale=n / math.sqrt(n_in))
        self.d_up = [u + rnd(d, 2 * d, scale=n / math.sqrt(d)) for u in self.up]
        self.d_down = [w + rnd(2 * d, d, scale=n / math.sqrt(2 * d)) for w in self.down]
        self.d_head = self.head + rnd(OUT_VOCAB, d, scale=n)
        for k, v in list(vars(self).items()):
            if isinstance(v, torch.Tensor):
                setattr(self, k, v.to(device))
            elif isinstance(v, list):
                setattr(self, k, [t.to(device) for t in v])


def _stage_layers(cfg: HarnessConfig) -> list[list[int]]:
    base, extra = divmod(cfg.layers, cfg.stages)
    out, start = [], 0
    for s in range(cfg.stages):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


@dataclass
class SpecCounters:
    """What one generation did, in SGLang's ``meta_info`` terms."""

    completion_tokens: int
    verify_ct: int
    correct_drafts: int
    proposed_drafts: int
    histogram: list[int]  # index = drafts accepted in one verify step (bonus excluded)

    def meta_info(self) -> dict[str, Any]:
        return {
            "spec_verify_ct": self.verify_ct,
            "spec_accept_length": self.completion_tokens / self.verify_ct if self.verify_ct else None,
            "spec_accept_rate": self.correct_drafts / self.proposed_drafts if self.proposed_drafts else None,
            "spec_num_correct_drafts": self.correct_drafts,
            "spec_num_proposed_drafts": self.proposed_drafts,
            "spec_accept_histogram": list(self.histogram),
        }


def spec_counters(records: Sequence[dict[str, Any]], completion_tokens: int, block: int) -> SpecCounters:
    hist = [0] * (block + 1)
    for r in records:
        hist[r["accepted"]] += 1
    return SpecCounters(
        completion_tokens=completion_tokens,
        verify_ct=len(records),
        correct_drafts=sum(r["accepted"] for r in records),
        proposed_drafts=sum(len(r["proposed"]) for r in records),
        histogram=hist,
    )


class Harness:
    """Target + draft + greedy verification. ``mode`` is ``d-only``, ``pd`` or ``pd-broken``.

    >>> h = Harness(seed=0, mode="pd", block=4)
    >>> tokens, records = h.generate(list(b"Question: 1+1?\\nAnswer:"), max_new_tokens=64)
    """

    def __init__(
        self,
        seed: int = 0,
        mode: str = "d-only",
        block: int = 4,
        device: str | torch.device = "cpu",
        config: HarnessConfig | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.cfg = config or HarnessConfig()
        if not -self.cfg.stages <= self.cfg.broken_stage < self.cfg.stages:
            raise ValueError(f"broken_stage {self.cfg.broken_stage} is not a stage of {self.cfg.stages}")
        self.broken_stage = self.cfg.broken_stage % self.cfg.stages
        self.seed, self.mode, self.block = seed, mode, block
        self.device = torch.device(device)
        self.w = _Weights(self.cfg, seed, self.device)
        self.stage_layers = _stage_layers(self.cfg)
        self._fc = torch.cat([self.w.proj] * self.cfg.stages, dim=1)  # [hidden, stages*hidden]

    # -- the pieces --------------------------------------------------------------------------------

    def memory(self, tokens: Sequence[int], draft: bool = False, start: torch.Tensor | None = None) -> torch.Tensor:
        """The slow state after ``tokens``: ``m = decay * m + emb[token]`` per token, from ``start`` (or zero)."""
        emb = self.w.d_emb if draft else self.w.emb
        toks = list(tokens)[-256:]
        m = torch.zeros(self.cfg.embed, device=self.device) if start is None else start
        if not toks:
            return m
        ids = torch.tensor(toks, device=self.device)
        ages = torch.arange(len(toks) - 1, -1, -1, device=self.device, dtype=torch.float32)
        return m * self.cfg.memory_decay ** len(toks) + (self.cfg.memory_decay**ages) @ emb[ids]

    def _inputs(self, windows: torch.Tensor, mem: torch.Tensor, draft: bool) -> torch.Tensor:
        emb, w_in = (self.w.d_emb, self.w.d_w_in) if draft else (self.w.emb, self.w.w_in)
        x = emb[windows].reshape(windows.shape[0], -1)
        m = self.cfg.memory_gain * _rmsnorm(mem).expand(windows.shape[0], -1)
        return torch.cat([x, m], dim=1) @ w_in

    def target_features(self, windows: torch.Tensor, mem: torch.Tensor) -> list[torch.Tensor]:
        """Per-stage contributions to the residual stream, ``[stages] x [B, hidden]``; they sum to the
        final hidden state."""
        h = self._inputs(windows, mem, draft=False)
        feats = []
        start = h
        for s, layers in enumerate(self.stage_layers):
            scale = 1.0 if s == 0 else self.cfg.later_scale
            for i in layers:
                h = h + scale * (F.gelu(_rmsnorm(h) @ self.w.up[i]) @ self.w.down[i])
            feats.append(h - start if s else h)
            start = h
        return feats

    def target_logits(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        h = torch.stack(list(feats)).sum(0)
        return _rmsnorm(h) @ self.w.head.T

    def context(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        """The draft's context ``c = fc @ concat(features)`` for one position, computed per ``mode``."""
        if self.mode == "d-only":
            return torch.cat(list(feats), dim=-1) @ self._fc.T
        p = self.w.proj.to(torch.bfloat16)
        running = torch.zeros_like(feats[0], dtype=torch.bfloat16)
        for s, f in enumerate(feats):
            if self.mode == "pd-broken" and s == self.broken_stage:
                continue  # this stage's partial never reaches the running sum
            running = running + f.to(torch.bfloat16) @ p.T  # bf16 GEMM, bf16 running sum
        return running.float()

    def _draft_hidden(self, windows: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        """The draft's own estimate of the target's final hidden state (noised weights, and a slow state
        frozen at the end of the prompt: the draft cannot follow the target's long-range memory)."""
        h = self._inputs(windows, mem, draft=True)
        for s, layers in enumerate(self.stage_layers):
            scale = 1.0 if s == 0 else self.cfg.later_scale
            for i in layers:
                h = h + scale * (F.gelu(_rmsnorm(h) @ self.w.d_up[i]) @ self.w.d_down[i])
        return h

    def _window(self, seq: Sequence[int]) -> list[int]:
        w = list(seq[-self.cfg.window :])
        return [BOS] * (self.cfg.window - len(w)) + w

    def propose(
        self, ctx: torch.Tensor, ctx_window: list[int], seq: list[int], draft_mem: torch.Tensor
    ) -> tuple[list[int], list[float]]:
        """``block`` draft tokens after ``seq``: the draft's own estimate for each drafted window, corrected by
        (target hidden state from the context) - (draft's estimate) at the verified window ``ctx_window``."""
        correction = torch.zeros(self.cfg.hidden, device=self.device)
        if self.cfg.draft_context:
            own = self._draft_hidden(torch.tensor([ctx_window], device=self.device), draft_mem)[0]
            correction = ctx @ self.w.proj - own  # the target's true state there minus the draft's estimate
        drafts: list[int] = []
        logps: list[float] = []
        for _ in range(self.block):
            win = torch.tensor([self._window(seq + drafts)], device=self.device)
            h = self._draft_hidden(win, draft_mem)[0] + correction
            logits = _rmsnorm(h) @ self.w.d_head.T
            tok = int(torch.argmax(logits))
            drafts.append(tok)
            logps.append(float(torch.log_softmax(logits, -1)[tok]))
        return drafts, logps

    # -- generation --------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompt_token_ids: Sequence[int],
        max_new_tokens: int,
        *,
        request_id: str | None = None,
        ignore_eos: bool = False,
        should_stop: Callable[[list[int]], bool] | None = None,
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """Greedy speculative generation. Returns the output tokens and one record per verify step
        (acceptance JSONL schema). Stops at EOS (unless ``ignore_eos``), when ``should_stop(output)`` is
        true after a token, or at ``max_new_tokens``; the EOS token is part of the output."""
        prompt = [int(t) for t in prompt_token_ids]
        phash = prompt_hash(prompt)
        rid = request_id or phash
        out: list[int] = []
        records: list[dict[str, Any]] = []
        if max_new_tokens <= 0:
            return out, records
        mem = self.memory(prompt)  # the target's slow state after the verified tokens
        draft_mem = self.memory(prompt, draft=True)

        def finished() -> bool:
            return (
                len(out) >= max_new_tokens
                or (not ignore_eos and out[-1] == EOS)
                or (should_stop is not None and should_stop(out))
            )

        # prefill: the target's next token after the prompt (no verify step)
        ctx_window = self._window(prompt)
        feats = self.target_features(torch.tensor([ctx_window], device=self.device), mem[None])
        out.append(int(torch.argmax(self.target_logits(feats)[0])))
        ctx = self.context([f[0] for f in feats])
        mem = self.memory(out[-1:], start=mem)
        step = 0
        while not finished():
            seq = prompt + out
            drafts, logps = self.propose(ctx, ctx_window, seq, draft_mem)
            windows = [self._window(seq + drafts[:i]) for i in range(self.block + 1)]
            mems = [mem]
            for tok in drafts:
                mems.append(self.memory([tok], start=mems[-1]))
            feats = self.target_features(torch.tensor(windows, device=self.device), torch.stack(mems))
            target = torch.argmax(self.target_logits(feats), -1).tolist()
            acc = 0
            while acc < self.block and drafts[acc] == target[acc]:
                acc += 1
            emitted: list[int] = []
            for tok in drafts[:acc] + [target[acc]]:
                out.append(tok)
                emitted.append(tok)
                if finished():
                    break
            records.append(
                {
                    "request_id": rid,
                    "step": step,
                    "proposed": drafts,
                    "accepted": acc,
                    "bonus": len(emitted) == acc + 1,
                    "draft_logprobs": logps,
                    "target_tokens": target,
                    "output_tokens": emitted,
                    "prompt_hash": phash,
                }
            )
            step += 1
            ctx_window = windows[acc]
            ctx = self.context([f[acc] for f in feats])
            mem = self.memory([target[acc]], start=mems[acc])
        return out, records

    def describe(self) -> dict[str, Any]:
        return {"seed": self.seed, "mode": self.mode, "block": self.block, "device": str(self.device),
                "config": self.cfg.to_dict()}


def write_acceptance_part(
    records: Sequence[dict[str, Any]],
    bundle_dir: str | Path,
    *,
    part: str = "harness",
    run_name: str | None = None,
    labels: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``records`` as ``BUNDLE/parts/<part>/acceptance.jsonl`` (creating the manifest when the bundle
    has none) and then the part's ``part.json`` (no tensors), which marks the part complete."""
    from probes.core.acceptance import AcceptanceRecorder
    from probes.core.bundle import write_json_atomic

    with AcceptanceRecorder(bundle_dir, part, run_name=run_name, labels=labels) as rec:
        for r in records:
            rec.record(
                r["request_id"], r["proposed"], r["accepted"], step=r["step"], bonus=r.get("bonus", True),
                draft_logprobs=r.get("draft_logprobs"), target_tokens=r.get("target_tokens"),
                prompt_hash=r.get("prompt_hash"), output_tokens=r.get("output_tokens"),
            )
        path = rec.path
    write_json_atomic(path.parent / "part.json", {"part": part, "tensors": [], "extra": extra or {}})
    return path
