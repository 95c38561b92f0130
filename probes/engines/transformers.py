"""Capture and acceptance records from Hugging Face transformers causal LMs (``PreTrainedModel``).

Needs torch only: transformers itself is never imported here (the objects handed in are used through
``torch.nn`` hooks and duck typing), so ``import probes.engines.transformers`` costs nothing extra.

>>> cap = ModelCapture(model, session, role="target").attach()
>>> cap.begin_request("q0")
>>> model.generate(ids, max_new_tokens=32)        # step 0 = prefill, step k = k-th decode / verify step
>>> cap.detach()                                   # hooks removed: the model runs exactly as before

Tensor names follow the SGLang plugin (``docs/sglang.md``) so an HF run and an SGLang run pair by name:

=====================  ==================  ================================================================
target model           draft model         what (rows = token positions, ``[tokens, ...]``)
=====================  ==================  ================================================================
``target.hidden``      ``draft.layer``     each decoder layer's output (the residual stream), ``layer=i``
``target.attn``        ``draft.attn``      the attention block's output (after ``o_proj``), ``layer=i``
``target.mlp``         ``draft.mlp``       the MLP block's output, ``layer=i``
``target.norm``        ``draft.hidden``    the final norm's output (the LM head's input)
``target.logits``      ``draft.logits``    the LM head's output (only the rows the model computed)
``target.k/.v``        ``draft.k/.v``      a KV cache read back (:func:`capture_kv`): ``[tokens, kv_heads, head_dim]``
=====================  ==================  ================================================================

Coordinates: ``request`` (the id given to :meth:`ModelCapture.begin_request`, one per batch row),
``step`` (0 for a forward whose cache is empty - the prefill -, then +1 per forward: each decode step or
assisted-generation verify step; a draft's forwards take the step of the verify they feed), ``tokens``
(the absolute positions the rows hold, from the cache length) and ``layer``.

:class:`AssistedAcceptance` records acceptance (``acceptance.jsonl``, the format of
:mod:`probes.core.acceptance`) from ``model.generate(assistant_model=...)`` through a *logits processor*: it
is called with the target's scores at every candidate position of each verify step, and the greedy
acceptance rule (the longest prefix of draft tokens equal to the target's argmax) is applied to them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from torch import nn

from probes.core.acceptance import AcceptanceRecorder
from probes.core.shards import ShardSpec

__all__ = [
    "POINTS",
    "AssistedAcceptance",
    "HandoffInjector",
    "ModelCapture",
    "TransformersProbeError",
    "cache_kv",
    "capture_kv",
    "cache_arg",
]

POINTS = ("hidden", "attn", "mlp", "norm", "logits")
_NAMES = {
    "target": {
        "hidden": "target.hidden",
        "attn": "target.attn",
        "mlp": "target.mlp",
        "norm": "target.norm",
        "logits": "target.logits",
        "k": "target.k",
        "v": "target.v",
    },
    "draft": {
        "hidden": "draft.layer",
        "attn": "draft.attn",
        "mlp": "draft.mlp",
        "norm": "draft.hidden",
        "logits": "draft.logits",
        "k": "draft.k",
        "v": "draft.v",
    },
}
_ROLE_RE = re.compile(r"[a-z][a-z0-9_]*")


class TransformersProbeError(ValueError):
    """A model whose structure the probes cannot find, or a probe used wrongly."""


def tensor_names(role: str) -> dict[str, str]:
    """Capture point -> tensor name for a role (``target``, ``draft`` or any other prefix)."""
    if role in _NAMES:
        return dict(_NAMES[role])
    if not _ROLE_RE.fullmatch(role):
        raise TransformersProbeError(f"role must be lower-case letters, digits and '_', got {role!r}")
    return {p: f"{role}.{p}" for p in (*POINTS, "k", "v")}


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    for attr in ("last_hidden_state", "logits"):
        t = getattr(value, attr, None)
        if isinstance(t, torch.Tensor):
            return t
    return None


def cache_arg(kwargs: dict[str, Any]) -> Any:
    """The KV cache a forward was given (transformers >= 5.2x names it ``cache``, earlier ``past_key_values``)."""
    c = kwargs.get("cache")
    return c if c is not None else kwargs.get("past_key_values")


def _cache_len(cache: Any) -> int:
    if cache is None:
        return 0
    get = getattr(cache, "get_seq_length", None)
    return int(get()) if callable(get) else 0


@dataclass
class _Structure:
    layers: list[nn.Module]
    attn: list[nn.Module | None]
    mlp: list[nn.Module | None]
    norm: nn.Module | None
    head: nn.Module | None


def find_structure(model: nn.Module) -> _Structure:
    """The decoder layers, their attention and MLP blocks, the final norm and the LM head of a causal LM."""
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    lists = [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) > 0 and n.rsplit(".", 1)[-1] in ("layers", "h", "layer", "blocks")
    ]
    if n_layers is not None:
        lists = [(n, m) for n, m in lists if len(m) == n_layers] or lists
    if not lists:
        raise TransformersProbeError(f"{type(model).__name__}: no decoder layer list (model.layers / h) found")
    lname, layers = lists[0]

    def child(block: nn.Module, names: Sequence[str]) -> nn.Module | None:
        for nm in names:
            sub = getattr(block, nm, None)
            if isinstance(sub, nn.Module):
                return sub
        return None

    attn = [child(b, ("self_attn", "attn", "attention", "self_attention")) for b in layers]
    mlp = [child(b, ("mlp", "feed_forward", "ffn")) for b in layers]
    parent = model.get_submodule(lname.rsplit(".", 1)[0]) if "." in lname else model
    norm = child(parent, ("norm", "ln_f", "final_layernorm", "final_layer_norm"))
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else child(model, ("lm_head",))
    return _Structure(list(layers), attn, mlp, norm, head if isinstance(head, nn.Module) else None)


class ModelCapture:
    """Forward hooks that capture one model's tensors into a :class:`probes.core.capture.ProbeSession`.

    ``points``: a subset of :data:`POINTS`; ``layers``: which decoder layers (default all). Captures go
    through ``session.capture``, so the session's filters, summary mode and byte budget apply; a disabled
    session costs one attribute check per hook, and :meth:`detach` removes every hook (zero cost).
    ``step_from``: a draft's capture takes the step of the target's next verify from the target's capture.
    """

    def __init__(
        self,
        model: nn.Module,
        session: Any,
        *,
        role: str = "target",
        points: Sequence[str] = POINTS,
        layers: Sequence[int] | None = None,
        step_from: ModelCapture | None = None,
    ) -> None:
        bad = [p for p in points if p not in POINTS]
        if bad:
            raise TransformersProbeError(f"unknown capture point(s) {bad}; known: {', '.join(POINTS)}")
        self.model = model
        self.session = session
        self.role = role
        self.names = tensor_names(role)
        self.points = tuple(points)
        self.structure = find_structure(model)
        n = len(self.structure.layers)
        self.layers = list(range(n)) if layers is None else [int(i) for i in layers]
        if any(not 0 <= i < n for i in self.layers):
            raise TransformersProbeError(f"layers {list(self.layers)} out of range: the model has {n} decoder layers")
        self.step_from = step_from
        self.requests: list[str] = ["0"]
        self.last_step = -1
        self.forced_step: int | None = None
        self.forwards = 0
        self._span: tuple[int, int, int] | None = None  # (step, first position, end position) of this forward
        self._handles: list[Any] = []

    # -- attaching ---------------------------------------------------------------------------------------
    def attach(self) -> Self:
        if self._handles:
            return self
        s = self.structure
        points = self._wanted_points()
        self._handles.append(self.model.register_forward_pre_hook(self._pre, with_kwargs=True))
        for i in self.layers:
            if "hidden" in points:
                self._handles.append(s.layers[i].register_forward_hook(self._hook("hidden", i)))
            if "attn" in points and s.attn[i] is not None:
                self._handles.append(s.attn[i].register_forward_hook(self._hook("attn", i)))  # type: ignore[union-attr]
            if "mlp" in points and s.mlp[i] is not None:
                self._handles.append(s.mlp[i].register_forward_hook(self._hook("mlp", i)))  # type: ignore[union-attr]
        if "norm" in points and s.norm is not None:
            self._handles.append(s.norm.register_forward_hook(self._hook("norm", None)))
        if "logits" in points and s.head is not None:
            self._handles.append(s.head.register_forward_hook(self._hook("logits", None)))
        return self

    def _wanted_points(self) -> tuple[str, ...]:
        """The points whose names the session's name filter keeps: hooks on the others would only be filtered
        (in an eager, host-bound decode loop each hook call costs the step its Python)."""
        cfg = getattr(self.session, "config", None)
        wants = getattr(cfg, "wants_name", None)
        if not getattr(self.session, "enabled", True) or not callable(wants):
            return self.points
        return tuple(p for p in self.points if wants(self.names[p]))

    def detach(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def __enter__(self) -> Self:
        return self.attach()

    def __exit__(self, *_: object) -> None:
        self.detach()

    # -- requests and steps ------------------------------------------------------------------------------
    def begin_request(self, request: str | Sequence[str], *, last_step: int = -1) -> None:
        """Name the batch rows of the following forwards; ``last_step``: the step already done elsewhere
        (a decode process continuing a prefill done in another process passes 0)."""
        self.requests = [request] if isinstance(request, str) else [str(r) for r in request]
        self.last_step = last_step

    @contextmanager
    def at_step(self, step: int) -> Iterator[None]:
        """Forwards inside take this step (e.g. a draft's prefill, step 0, run before the target's verify)."""
        old, self.forced_step = self.forced_step, step
        try:
            yield
        finally:
            self.forced_step = old

    @property
    def next_step(self) -> int:
        return self.last_step + 1

    def _pre(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        length = int(ids.shape[1]) if isinstance(ids, torch.Tensor) and ids.dim() >= 2 else 0
        past = _cache_len(cache_arg(kwargs))
        if self.forced_step is not None:
            step = self.forced_step
        elif self.step_from is not None:
            step = self.step_from.next_step
        else:
            step = 0 if past == 0 else self.last_step + 1
            self.last_step = step
        self.forwards += 1
        self._span = (step, past, past + length)

    def _hook(self, point: str, layer: int | None) -> Callable[..., None]:
        name = self.names[point]
        extra = {} if layer is None else {"layer": layer}  # never changed: unpacked into each capture's coordinates

        def hook(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
            if not self.session.enabled or self._span is None:
                return
            t = _first_tensor(output)
            if t is None or t.dim() < 2:
                return
            step, _, end = self._span
            rows = int(t.shape[1])
            for b, rid in enumerate(self.requests[: t.shape[0]]):
                self.session.capture(name, t[b], step=step, request=rid, tokens=(end - rows, end), **extra)

        return hook


# -- KV caches ---------------------------------------------------------------------------------------------


def cache_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(keys, values)`` of a transformers cache, each ``[batch, kv_heads, tokens, head_dim]``."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(lay.keys, lay.values) for lay in layers]
    kc, vc = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if kc is not None and vc is not None:
        return list(zip(kc, vc, strict=True))
    raise TransformersProbeError(f"cannot read the KV tensors of a {type(cache).__name__}")


def capture_kv(
    session: Any,
    kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    role: str,
    step: int,
    request: str | Sequence[str],
    start: int = 0,
    tp: tuple[int, int] | None = None,
    layers: Sequence[int] | None = None,
) -> None:
    """Capture K/V per layer as ``<role>.k`` / ``<role>.v`` ``[tokens, kv_heads, head_dim]`` (rows from
    ``start``). ``tp=(rank, size)``: the tensors hold that rank's KV heads, recorded as ``split(dim=1)``."""
    if not session.enabled:
        return
    names = tensor_names(role)
    rids = [request] if isinstance(request, str) else list(request)
    shard = ShardSpec.split(1, tp[0], tp[1]) if tp is not None else None
    for i, (k, v) in enumerate(kv):
        if layers is not None and i not in layers:
            continue
        n = int(k.shape[2])
        for b, rid in enumerate(rids[: k.shape[0]]):
            for nm, t in ((names["k"], k), (names["v"], v)):
                session.capture(
                    nm, t[b].transpose(0, 1), shard=shard, step=step, request=rid, tokens=(start, start + n), layer=i
                )


class HandoffInjector:
    """Seeds a model's first forward with a KV state computed elsewhere (a prefill process's hand-off).

    ``generate(assistant_model=draft)`` builds the draft's cache itself, empty, and feeds it the whole
    prompt. Armed with per-layer ``(k, v)`` for the first ``n`` positions, a forward pre-hook fills that
    empty cache (``cache.update``) and removes the ``n`` positions from the forward's inputs, so the draft
    continues from the handed-over state instead of recomputing it. Disarms after one use.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._n = 0
        self.used = 0
        self._handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def arm(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._kv = list(kv)
        self._n = int(self._kv[0][0].shape[2]) if self._kv else 0

    def remove(self) -> None:
        self._handle.remove()

    def _pre(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._kv is None:
            return None
        cache = cache_arg(kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if cache is None or _cache_len(cache) != 0 or not isinstance(ids, torch.Tensor) or ids.shape[1] <= self._n:
            raise TransformersProbeError(
                f"hand-off: expected a first forward with an empty cache and more than {self._n} positions"
            )
        kv, n, self._kv = self._kv, self._n, None
        for i, (k, v) in enumerate(kv):
            cache.update(k.to(ids.device), v.to(ids.device), i)
        if args:
            args = (args[0][:, n:], *args[1:])
        else:
            kwargs["input_ids"] = ids[:, n:]
        for key in ("position_ids", "cache_position"):
            t = kwargs.get(key)
            if isinstance(t, torch.Tensor) and t.shape[-1] == ids.shape[1]:
                kwargs[key] = t[..., n:]
        self.used += 1
        return args, kwargs


# -- acceptance --------------------------------------------------------------------------------------------


@dataclass
class _Verify:
    step: int
    scores: list[tuple[int, int]] = field(default_factory=list)  # (input length, target argmax)
    ids: list[int] = field(default_factory=list)  # the longest input_ids seen (the candidate sequence)


class AssistedAcceptance:
    """Acceptance records from ``target.generate(assistant_model=draft, logits_processor=[acc.processor])``.

    Forward pre-hooks on both models say which one runs; the logits processor, called by transformers with
    the target's scores at each of the ``L + 1`` positions of a verify step (the ``L`` draft tokens and the
    bonus position), collects the target's greedy tokens. At the next target forward (or :meth:`end_request`)
    the step is recorded: ``proposed`` = the ``L`` draft tokens, ``accepted`` = how many lead the target's
    choices, ``target_tokens`` = the target's ``L + 1`` choices. Greedy verification only (``do_sample``
    uses another rule). The processor must come last in ``logits_processor`` (custom processors are
    appended after transformers' own, so it sees the scores the decision is made on). The same processor is
    also called by the draft's own ``generate``: those calls are ignored.
    """

    def __init__(self, recorder: AcceptanceRecorder | None, target: nn.Module, draft: nn.Module) -> None:
        self.recorder = recorder
        self.records: list[dict[str, Any]] = []
        self.request = "0"
        self.last_step = -1
        self._running: str | None = None
        self._verify: _Verify | None = None
        self._handles = [
            target.register_forward_pre_hook(self._target_pre, with_kwargs=True),
            draft.register_forward_pre_hook(self._draft_pre, with_kwargs=True),
        ]

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def begin_request(self, request: str, *, last_step: int = -1) -> None:
        self._finish()
        self.request = request
        self.last_step = last_step

    def end_request(self) -> None:
        self._finish()
        if self.recorder is not None:
            self.recorder.end_request(self.request)

    def _target_pre(self, _m: nn.Module, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._finish()
        past = _cache_len(cache_arg(kwargs))
        self.last_step = 0 if past == 0 else self.last_step + 1
        self._running = "target"
        self._verify = _Verify(self.last_step)

    def _draft_pre(self, _m: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any]) -> None:
        self._running = "draft"

    def processor(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """The logits processor: reads the scores, never changes them."""
        v = self._verify
        if self._running == "target" and v is not None and input_ids.shape[0] == 1:
            v.scores.append((int(input_ids.shape[1]), int(scores[0].argmax())))
            if input_ids.shape[1] > len(v.ids):
                v.ids = input_ids[0].tolist()
        return scores

    __call__ = processor

    def _finish(self) -> None:
        v, self._verify = self._verify, None
        if v is None or len(v.scores) < 2:
            return  # a plain forward (no candidates to verify)
        v.scores.sort()
        cur = v.scores[0][0]
        proposed = v.ids[cur:]
        target = [t for _, t in v.scores][: len(proposed) + 1]
        accepted = 0
        while accepted < len(proposed) and proposed[accepted] == target[accepted]:
            accepted += 1
        rec = {
            "request_id": self.request,
            "step": v.step,
            "proposed": proposed,
            "accepted": accepted,
            "target_tokens": target,
        }
        self.records.append(rec)
        if self.recorder is not None:
            self.recorder.record(self.request, proposed, accepted, step=v.step, target_tokens=target)
