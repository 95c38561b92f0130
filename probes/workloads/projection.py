"""The projection probe: a reference implementation of the DFlash context path, three ways.

From the same target hidden states (one ``[tokens, hidden]`` tensor per capture layer) it computes

- ``concat``: one GEMM over the concatenated features, ``cat(h_a, h_b, ...) @ W.T`` (PP1 / SGLang main);
- ``partial-<acc>``: per-stage GEMMs ``x_local @ W[:, cols].T`` added into a running sum that is handed
  from stage to stage in pipeline order, in accumulation dtype ``<acc>`` (``bf16`` as deployed, or
  ``fp32``); a stage with no capture layer hands the sum on untouched;
- ``ref``: the same in float64 throughout (torch kernels only),

then, for each path, the RMSNorm'd context (``hidden_norm``, applied once after the full sum) and, for
every draft layer, K (K rows of the fused QKV weight -> per-head ``k_norm`` -> neox RoPE) and V (V rows).

Layout checks run before any arithmetic and raise :class:`ProjectionConfigError`. Needs torch only;
flashinfer is imported lazily, on CUDA, for RMSNorm and RoPE. Writes one run bundle per path.

This module is the public face (:func:`run_probe`, and every name re-exported); the parts live in
``projection_config`` (dtypes, config, layout checks), ``projection_math`` (inputs, kernels, the paths) and
``projection_io`` (reading hidden states, writing bundles).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .projection_config import (
    DTYPES,
    ProjectionConfig,
    ProjectionConfigError,
    ProjectionLayout,
    StagePlan,
    check_path,
    default_paths,
    even_split,
    handoff_bytes,
    parse_pp_split,
    plan_layout,
)
from .projection_config import short_dtype as short_dtype
from .projection_io import HIDDEN_NAME as HIDDEN_NAME
from .projection_io import ProbeRun, load_hidden_states, write_path_bundle
from .projection_io import kind_of as kind_of
from .projection_math import (
    Kernels,
    PathResult,
    ProjectionWeights,
    StageOutput,
    compute_path,
    make_hidden_states,
    make_weights,
    select_kernels,
)
from .projection_math import rope_cos_sin as rope_cos_sin
from .projection_math import torch_rmsnorm as torch_rmsnorm
from .projection_math import torch_rope as torch_rope

__all__ = [
    "DTYPES",
    "Kernels",
    "PathResult",
    "ProbeRun",
    "ProjectionConfig",
    "ProjectionConfigError",
    "ProjectionLayout",
    "ProjectionWeights",
    "StageOutput",
    "StagePlan",
    "compute_path",
    "default_paths",
    "even_split",
    "handoff_bytes",
    "load_hidden_states",
    "make_hidden_states",
    "make_weights",
    "parse_pp_split",
    "plan_layout",
    "run_probe",
    "select_kernels",
]


def environment(device: torch.device, kernels: Kernels) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        env.update(
            gpu=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            allow_bf16_reduced_precision_reduction=torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        )
    env["flashinfer"] = kernels.version
    if kernels.note:
        env["kernels_note"] = kernels.note
    return env


def run_probe(
    cfg: ProjectionConfig,
    out_dir: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    paths: Sequence[str] | None = None,
    kernels: str = "auto",
    hidden: Mapping[int, torch.Tensor] | None = None,
    input_source: str | None = None,
    prefix: str = "projection",
    write_stages: bool = True,
) -> ProbeRun:
    """Check the layout, build (or take) the inputs, compute every path, and write one bundle per path
    under ``out_dir/<path>/`` when ``out_dir`` is given. ``hidden`` overrides the synthetic inputs
    (``{layer: [tokens, hidden]}``; tokens and hidden size are taken from it)."""
    if hidden is not None:
        first = next(iter(hidden.values()))
        cfg = dataclasses.replace(cfg, tokens=int(first.shape[0]), hidden=int(first.shape[-1]))
    layout = plan_layout(cfg)  # every structural check before any arithmetic
    names = tuple(paths) if paths else default_paths(cfg)
    for n in names:
        check_path(n)
    if len(set(names)) != len(names):
        raise ProjectionConfigError(f"paths listed twice: {names}")
    dev = _device(device)
    kern = select_kernels(kernels, dev)
    if hidden is None:
        hs = make_hidden_states(cfg, dev)
        source = f"synthetic(seed={cfg.seed})"
    else:
        missing = [c for c in cfg.capture_layers if c not in hidden]
        if missing:
            raise ProjectionConfigError(f"hidden states missing capture layer(s) {missing}")
        hs = {c: hidden[c].to(device=dev, dtype=cfg.torch_dtype) for c in cfg.capture_layers}
        source = input_source or "given"
    feats = [hs[c] for c in cfg.capture_layers]
    weights = make_weights(cfg, dev)
    run = ProbeRun(cfg, layout, kern, {}, handoff_bytes(cfg, layout), environment(dev, kern), {}, source)
    with torch.no_grad():
        for n in names:
            res = compute_path(n, feats, weights, cfg, layout, kern)
            run.paths[n] = res
            if out_dir is not None:
                run.bundles[n] = write_path_bundle(Path(out_dir), prefix, res, run, write_stages)
    return run


def _device(device: str | torch.device) -> torch.device:
    """``auto``: CUDA when this torch has it, else the CPU. A named device must exist (checked here, before
    any arithmetic, so that a CPU-only torch gets a configuration error instead of a failure mid-run)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ProjectionConfigError(f"--device {device!r}: not a device ({exc})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ProjectionConfigError(
                f"--device {device}: this torch ({torch.__version__}) has no usable CUDA; use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ProjectionConfigError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type != "cpu":
        raise ProjectionConfigError(f"--device {device}: only cpu and cuda devices are supported")
    return dev
