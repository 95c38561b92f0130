"""The wrappers the plugin puts around SGLang functions, one factory per capture point (see points.py).

A factory gets the plugin, the point name and the original function and returns the replacement. Every
replacement calls the original with the same arguments and returns its result unchanged; the plugin's
own work runs inside ``plugin.guard`` (it can never raise into SGLang) and is skipped entirely when the
point is not selected or the part is closed. Arguments are read by parameter name, so keyword-only and
positional call styles both work. Nothing here imports SGLang.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from probes.core.config import glob_match
from probes.core.shards import ShardSpec

from .runtime import Plugin, infer_kv_shard

__all__ = ["FACTORIES"]

Args = Mapping[str, Any]


def _binder(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return lambda args, kwargs: dict(kwargs)

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            b = sig.bind_partial(*args, **kwargs)
        except TypeError:
            return dict(kwargs)
        b.apply_defaults()
        return dict(b.arguments)

    return bind


def _wrap(
    plugin: Plugin,
    point: str,
    fn: Callable[..., Any],
    before: Callable[[Args], Any] | None = None,
    after: Callable[[Args, Any, Any], None] | None = None,
) -> Callable[..., Any]:
    bind = _binder(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not plugin.wants(point):
            return fn(*args, **kwargs)
        plugin.stats[point].reached += 1
        a: dict[str, Any] = {}
        state = None
        with plugin.guard(point):
            a = bind(args, kwargs)
            if before is not None:
                state = before(a)
        result = fn(*args, **kwargs)
        if after is not None:
            with plugin.guard(point):
                after(a, result, state)
        return result

    wrapper.__validator_probe__ = point  # type: ignore[attr-defined]
    return wrapper


def _first(a: Args, *names: str) -> Any:
    for n in names:
        if a.get(n) is not None:
            return a[n]
    return None


def _tp(plugin: Plugin) -> tuple[int, int]:
    c = plugin.coords()
    return c.get("tp_rank", 0), c.get("tp_size", 1)


# -- batch: the step / request context ------------------------------------------------------------------


def batch_context(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    bind = _binder(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not plugin.wants(point) or plugin.batch is not None:  # nested worker calls keep the outer context
            return fn(*args, **kwargs)
        plugin.stats[point].reached += 1
        with plugin.guard(point):
            plugin.begin_batch(_first(bind(args, kwargs), "batch"))
        try:
            return fn(*args, **kwargs)
        finally:
            with plugin.guard(point):
                plugin.end_batch()

    wrapper.__validator_probe__ = point  # type: ignore[attr-defined]
    return wrapper


# -- target hidden states per capture layer, on the stage that owns the layer -------------------------------


def _layers_module(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.ModuleList] | None:
    """The decoder's ``layers`` ModuleList (the longest one) and the module holding it."""
    best = None
    for mod in model.modules():
        layers = getattr(mod, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and (best is None or len(layers) > len(best[1])):
            best = (mod, layers)
    return best


def _sglang_capture(model: torch.nn.Module) -> list[int] | None:
    """The layer outputs SGLang itself is configured to capture on this stage (None: not found)."""
    for mod in model.modules():
        v = getattr(mod, "dspark_layers_to_capture", None)
        if isinstance(v, (list, tuple)):
            return sorted(int(x) for x in v)
    for mod in model.modules():
        v = getattr(mod, "layers_to_capture", None)
        if isinstance(v, (list, tuple)):
            return sorted(int(x) - 1 for x in v)  # stored as the next layer's input
    return None


def _stream(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        if len(output) > 1 and isinstance(output[1], torch.Tensor) and output[1].shape == output[0].shape:
            return output[0] + output[1]  # (hidden_states, residual): the stream entering the next layer
        return output[0]
    return None


def attach_target(plugin: Plugin, point: str, model: torch.nn.Module) -> None:
    found = _layers_module(model)
    if found is None:
        plugin.note_error(point, f"no decoder layers found in {type(model).__name__}")
        return
    holder, layers = found
    start = int(getattr(holder, "start_layer", 0) or 0)
    end = int(getattr(holder, "end_layer", len(layers)) or len(layers))
    plugin.coverage["owned"] = [start, end]
    plugin.coverage["model"] = type(model).__name__

    def learn(requested: Any) -> None:
        if requested is not None and not plugin.cfg.capture_layers:
            plugin.capture_layers = tuple(int(x) for x in requested)
        plugin.coverage["sglang_capture"] = _sglang_capture(model)

    for meth in ("set_dflash_layers_to_capture", "set_dspark_layers_to_capture", "set_eagle3_layers_to_capture"):
        orig = getattr(model, meth, None)
        if callable(orig):

            def setter(layer_ids: Any = None, *rest: Any, _orig: Callable[..., Any] = orig, **kw: Any) -> Any:
                out = _orig(layer_ids, *rest, **kw)
                with plugin.guard(point):
                    learn(layer_ids)
                return out

            setattr(model, meth, setter)

    def hook(layer_id: int) -> Callable[..., None]:
        def on_output(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not plugin.wants(point):
                return
            with plugin.guard(point):
                if plugin.coverage.get("sglang_capture") is None:
                    plugin.coverage["sglang_capture"] = _sglang_capture(model)
                if plugin.capture_layers is None or layer_id not in plugin.capture_layers:
                    return
                plugin.stats[point].reached += 1
                h = _stream(output)
                if h is None:
                    plugin.note_error(point, f"layer {layer_id}: output of type {type(output).__name__} not understood")
                    return
                if layer_id not in plugin.coverage["seen"]:
                    plugin.coverage["seen"].append(layer_id)
                plugin.capture_rows(point, "target.hidden", h, layer=layer_id)

        return on_output

    for i in range(start, min(end, len(layers))):
        layers[i].register_forward_hook(hook(i))


def target_layers(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def after(a: Args, result: Any, state: Any) -> None:
        runner = a.get("self")
        model = getattr(runner, "model", None)
        if not isinstance(model, torch.nn.Module):
            return
        if getattr(runner, "is_draft_worker", False):
            ids = getattr(getattr(model, "draft_config", None), "target_layer_ids", None)
            if ids and not plugin.cfg.capture_layers:
                plugin.capture_layers = tuple(int(x) for x in ids)
            return
        attach_target(plugin, point, model)

    return _wrap(plugin, point, fn, after=after)


# -- the context projection (DFlash / DSpark draft models) ------------------------------------------------


def _feature_layers(plugin: Plugin, model: Any, k: int) -> list[int | None]:
    ids = getattr(getattr(model, "draft_config", None), "target_layer_ids", None)
    if ids and len(ids) == k:
        if not plugin.cfg.capture_layers:
            plugin.capture_layers = tuple(int(x) for x in ids)
        return [int(x) for x in ids]
    if plugin.capture_layers and len(plugin.capture_layers) == k:
        return list(plugin.capture_layers)
    return [None] * k


def _norm_hook(plugin: Plugin, model: Any) -> None:
    """Capture the input of the draft model's ``hidden_norm`` (the pre-norm projection) while projecting."""
    norm = getattr(model, "hidden_norm", None)
    if not isinstance(norm, torch.nn.Module) or getattr(norm, "__validator_hooked__", False):
        return

    def pre(module: torch.nn.Module, args: Any) -> None:
        if plugin.in_project and args and isinstance(args[0], torch.Tensor):
            with plugin.guard("ctx.project"):
                plugin.capture_rows("ctx.project", "ctx.pre_norm", args[0])

    norm.register_forward_pre_hook(pre)
    setattr(norm, "__validator_hooked__", True)  # noqa: B010 - a flag on a module that declares no such field


def project(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def before(a: Args) -> None:
        model, x = a.get("self"), _first(a, "target_hidden")
        _norm_hook(plugin, model)
        plugin.in_project = True
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return
        k = int(getattr(model, "num_context_features", 0) or len(plugin.capture_layers or ()) or 1)
        if x.shape[1] % k:
            k = 1
        width = x.shape[1] // k
        for j, layer in enumerate(_feature_layers(plugin, model, k)):
            extra: dict[str, Any] = {"layer": layer} if layer is not None else {"feature": j}
            if layer is not None and layer not in plugin.coverage["seen"]:
                plugin.coverage["seen"].append(layer)
            plugin.capture_rows(point, "target.features", x[:, j * width : (j + 1) * width], **extra)

    def after(a: Args, result: Any, state: Any) -> None:
        plugin.in_project = False
        if isinstance(result, torch.Tensor):
            plugin.capture_rows(point, "ctx.normed", result)

    inner = _wrap(plugin, point, fn, before=before, after=after)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        finally:
            plugin.in_project = False

    wrapper.__validator_probe__ = point  # type: ignore[attr-defined]
    return wrapper


def project_partial(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def before(a: Args) -> None:
        x = _first(a, "x_local", "target_hidden", "hidden_states")
        idx = _first(a, "feature_indices")
        if not isinstance(x, torch.Tensor) or idx is None:
            return
        idx = [int(i) for i in (idx.tolist() if isinstance(idx, torch.Tensor) else idx)]
        if not idx or x.shape[-1] % len(idx):
            return
        width = x.shape[-1] // len(idx)
        layers = plugin.capture_layers
        for j, f in enumerate(idx):
            layer = layers[f] if layers and f < len(layers) else None
            if layer is not None and layer not in plugin.coverage["seen"]:
                plugin.coverage["seen"].append(layer)
            extra: dict[str, Any] = {"layer": layer} if layer is not None else {"feature": f}
            plugin.capture_rows(point, "target.features", x[:, j * width : (j + 1) * width], **extra)

    def after(a: Args, result: Any, state: Any) -> None:
        if isinstance(result, torch.Tensor):
            c = plugin.coords()
            shard = ShardSpec.partial(c.get("pp_stage", 0), c.get("pp_size", 1))
            plugin.capture_rows(point, "ctx.partial", result, shard=shard)

    return _wrap(plugin, point, fn, before=before, after=after)


def write_projected(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def before(a: Args) -> None:
        x = _first(a, "projected_context", "projected", "ctx_acc", "context")
        if x is None:  # first tensor argument after self
            x = next((v for k, v in a.items() if k != "self" and isinstance(v, torch.Tensor)), None)
        if isinstance(x, torch.Tensor):
            plugin.capture_rows(point, "ctx.pre_norm", x)

    def after(a: Args, result: Any, state: Any) -> None:
        if plugin.wants("draft.kv"):  # the last stage writes the draft KV here
            plugin.stats["draft.kv"].reached += 1
            _readback(plugin, "draft.kv", a, a.get("pool"), getattr(a.get("self"), "layers", None))

    return _wrap(plugin, point, fn, before=before, after=after)


# -- tensors handed to the next PP stage ----------------------------------------------------------------------


def _is_pp_group(group: Any) -> bool:
    try:
        from sglang.srt.distributed import parallel_state as ps  # only inside SGLang

        return group is ps.get_pp_group()
    except Exception:
        return "pp" in str(getattr(group, "unique_name", "")).lower()


def pp_send(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def before(a: Args) -> None:
        d = _first(a, "tensor_dict")
        if not isinstance(d, Mapping) or not _is_pp_group(a.get("self")):
            return
        for key, t in d.items():
            if isinstance(t, torch.Tensor) and any(glob_match(p, str(key)) for p in plugin.cfg.pp_keys):
                plugin.capture_rows(point, f"pp.send.{key}", t)

    return _wrap(plugin, point, fn, before=before)


# -- draft K/V as written, read back from the pool ------------------------------------------------------------


def _readback(plugin: Plugin, point: str, a: Args, pool: Any, layers: Any) -> None:
    loc, pos = _first(a, "cache_loc"), _first(a, "positions")
    loc2d, commit = a.get("cache_loc_2d"), a.get("commit_lens")
    if pool is None or layers is None or not isinstance(loc, torch.Tensor):
        plugin.note_error(point, "cannot find the draft KV pool, layers or cache locations")
        return
    counts = None
    if isinstance(loc2d, torch.Tensor) and isinstance(commit, torch.Tensor):
        n_per = [int(c) for c in commit.tolist()]  # host copy: the committed rows of each request
        width = loc2d.shape[1]
        rows = (
            torch.cat([torch.arange(i * width, i * width + c, device=loc.device) for i, c in enumerate(n_per)])
            if n_per
            else torch.empty(0, dtype=torch.long, device=loc.device)
        )
        loc = loc2d.reshape(-1)[rows]
        pos = pos.reshape(-1)[rows] if isinstance(pos, torch.Tensor) else None
        counts = n_per
    elif isinstance(a.get("extend_lens"), torch.Tensor):
        counts = [int(c) for c in a["extend_lens"].tolist()]
    starts = None
    if isinstance(pos, torch.Tensor) and counts is not None and sum(counts) == pos.numel():
        offs = [sum(counts[:i]) for i in range(len(counts))]
        host = pos.reshape(-1).tolist()
        starts = [int(host[o]) if c else 0 for o, c in zip(offs, counts)]
    tp_rank, tp_size = _tp(plugin)
    loc = loc.to(torch.long)
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", layer)
        lid = getattr(getattr(attn, "attn", None), "layer_id", i)
        local = int(getattr(attn, "num_kv_heads", 0) or 0)
        total = int(getattr(attn, "total_num_kv_heads", 0) or 0)
        head_dim = int(getattr(attn, "head_dim", 0) or 0)
        shard = infer_kv_shard(local, total, tp_rank, tp_size) if local and total else None
        for name, getter in (("draft.k", "get_key_buffer"), ("draft.v", "get_value_buffer")):
            buf = getattr(pool, getter)(lid)
            t = buf[loc]
            if t.dim() == 2 and local and head_dim and t.shape[1] == local * head_dim:
                t = t.view(-1, local, head_dim)
            plugin.capture_rows(point, name, t, shard=shard, counts=counts, starts=starts, layer=i)


def kv_readback(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def after(a: Args, result: Any, state: Any) -> None:
        owner = a.get("self")
        if a.get("pool") is not None:  # DSpark: write_target_hidden_kv(pool=..., ...) on the draft model
            _readback(plugin, point, a, a["pool"], getattr(owner, "layers", None))
        else:  # DFlash worker: the draft runner's pool and the draft model's layers
            runner = getattr(owner, "draft_model_runner", None)
            model = getattr(owner, "draft_model", None)
            _readback(plugin, point, a, getattr(runner, "token_to_kv_pool", None), getattr(model, "layers", None))

    return _wrap(plugin, point, fn, after=after)


def kv_steps(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    name = fn.__name__

    def after(a: Args, result: Any, state: Any) -> None:
        attn = a.get("self")
        layer = getattr(getattr(attn, "attn", None), "layer_id", None)
        local, head_dim = int(getattr(attn, "num_kv_heads", 1) or 1), int(getattr(attn, "head_dim", 0) or 0)
        tp_rank, tp_size = _tp(plugin)
        shard = infer_kv_shard(local, int(getattr(attn, "total_num_kv_heads", local) or local), tp_rank, tp_size)

        def put(tname: str, t: Any) -> None:
            if isinstance(t, torch.Tensor):
                if head_dim and t.dim() == 2 and t.shape[1] == local * head_dim:
                    t = t.view(-1, local, head_dim)
                plugin.capture_rows(point, tname, t, shard=shard, layer=layer)

        if name == "kv_proj_only" and isinstance(result, tuple) and len(result) == 2:
            put("draft.k_proj", result[0])
            put("draft.v", result[1])
        elif name == "apply_k_norm":
            put("draft.k_norm", result)
        elif name == "apply_k_rope":
            put("draft.k_rope", result)

    return _wrap(plugin, point, fn, after=after)


# -- draft logits ---------------------------------------------------------------------------------------------


def draft_logits(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def starts() -> list[int] | None:
        b = plugin.batch
        return [s + 1 for s in b.starts] if b is not None and b.starts is not None else None

    def before(a: Args) -> None:
        hs, head = _first(a, "hidden_states"), a.get("lm_head")
        if not isinstance(hs, torch.Tensor) or hs.numel() == 0:
            return
        plugin.capture_rows(point, "draft.hidden", hs, starts=starts())
        w = getattr(head, "weight", None)
        if (
            not isinstance(w, torch.Tensor)
            or w.dim() != 2
            or w.dtype not in (torch.float16, torch.bfloat16, torch.float32)
        ):
            return
        with torch.no_grad():
            logits = hs.to(w.dtype) @ w.T
        shard_idx = getattr(head, "shard_indices", None)
        if shard_idx is not None:
            logits = logits[:, : int(shard_idx.num_org_elements)]
            tp_rank, tp_size = _tp(plugin)
            shard = ShardSpec.split(1, tp_rank, tp_size) if tp_size > 1 else None
        else:
            shard = None
        plugin.capture_rows(point, "draft.logits", logits, shard=shard, starts=starts())

    def after(a: Args, result: Any, state: Any) -> None:
        if isinstance(result, torch.Tensor) and result.dim() == 1:
            plugin.capture_rows(point, "draft.tokens", result, starts=starts())

    return _wrap(plugin, point, fn, before=before, after=after)


# -- acceptance per verify step -------------------------------------------------------------------------------


def _to_host(ts: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
    """Copies of ``ts`` on the host (asynchronous for CUDA tensors) and an event marking their completion."""
    if not ts or not ts[0].is_cuda:
        return [t.detach().to("cpu", copy=True) for t in ts], None
    hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in ts]
    for h, t in zip(hosts, ts):
        h.copy_(t.detach(), non_blocking=True)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return hosts, event


def accept(plugin: Plugin, point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def after(a: Args, result: Any, state: Any) -> None:
        b = plugin.batch
        cand = _first(a, "candidates")
        if b is None or not isinstance(cand, torch.Tensor) or cand.dim() != 2 or plugin.acceptance() is None:
            return
        if isinstance(result, tuple):  # DFlash _accept_block: (accept_len, commit_lens, bonus, out_tokens, ...)
            accepted = result[0]
        else:  # DSpark _accept: commit lengths (accepted drafts + the bonus token)
            accepted = result - 1
        if not isinstance(accepted, torch.Tensor):
            return
        bs = len(b.reqs)
        hosts, event = _to_host([cand[:bs, 1:], accepted.reshape(-1)[:bs]])
        reqs, steps = list(b.reqs), list(b.steps)
        cfg = plugin.config

        def write(block: bool) -> bool:
            if event is not None:
                if not block and not event.query():
                    return False
                event.synchronize()
            rec = plugin.acceptance()
            if rec is None:
                return True
            prop, acc = hosts[0].tolist(), hosts[1].tolist()
            for rid, step, p, n in zip(reqs, steps, prop, acc):
                if cfg.wants_request(rid) and cfg.wants_step(step):
                    rec.record(rid, proposed=p, accepted=max(0, min(int(n), len(p))), step=step)
                    plugin.stats[point].captured += 1
            return True

        plugin.defer(write)

    return _wrap(plugin, point, fn, after=after)


FACTORIES: dict[str, Callable[[Plugin, str, Callable[..., Any]], Callable[..., Any]]] = {
    "batch_context": batch_context,
    "target_layers": target_layers,
    "project": project,
    "project_partial": project_partial,
    "write_projected": write_projected,
    "pp_send": pp_send,
    "kv_readback": kv_readback,
    "kv_steps": kv_steps,
    "draft_logits": draft_logits,
    "accept": accept,
}
