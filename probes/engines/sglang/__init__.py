"""Validator probes inside SGLang servers, loaded without editing SGLang (see docs/sglang.md).

Imports torch alone; SGLang is only ever touched inside a running SGLang process. Enable with
``VALIDATOR_PROBE_BUNDLE=...`` (plus the other ``VALIDATOR_PROBE_*`` settings of :mod:`probes.core.config`) and
``VALIDATOR_SGLANG_*`` (points, required points, role, capture layers), then start the server with
``python -m probes.engines.sglang.launch -- <sglang args>``. Without those variables nothing is installed.

The names below load on first use (PEP 562): the validator's ingest reads :mod:`probes.engines.sglang.coverage`
(plain JSON) without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probes.core.lazy import lazy_exports

if TYPE_CHECKING:
    from .coverage import CoverageResult, check_coverage, read_reports
    from .heads import HeadLayoutError, check_heads, head_ranks, heads_per_rank, kv_head_shard, rank_heads
    from .install import PluginStartupError, activate, current, deactivate
    from .points import POINTS, Point, Target, point_names
    from .resolve import PointStatus, Resolution, check_points, resolve_static, sglang_root, sglang_version
    from .runtime import Plugin, PluginConfig, infer_kv_shard

__all__ = [
    "CoverageResult",
    "HeadLayoutError",
    "POINTS",
    "Plugin",
    "PluginConfig",
    "PluginStartupError",
    "Point",
    "PointStatus",
    "Resolution",
    "Target",
    "activate",
    "check_coverage",
    "check_heads",
    "check_points",
    "current",
    "deactivate",
    "head_ranks",
    "heads_per_rank",
    "infer_kv_shard",
    "kv_head_shard",
    "point_names",
    "rank_heads",
    "read_reports",
    "resolve_static",
    "sglang_root",
    "sglang_version",
]

__getattr__, __dir__, _ = lazy_exports(
    __name__,
    {
        "coverage": ["CoverageResult", "check_coverage", "read_reports"],
        "heads": ["HeadLayoutError", "check_heads", "head_ranks", "heads_per_rank", "kv_head_shard", "rank_heads"],
        "install": ["PluginStartupError", "activate", "current", "deactivate"],
        "points": ["POINTS", "Point", "Target", "point_names"],
        "resolve": ["PointStatus", "Resolution", "check_points", "resolve_static", "sglang_root", "sglang_version"],
        "runtime": ["Plugin", "PluginConfig", "infer_kv_shard"],
    },
    # importable as attributes without an import statement
    submodules=("coverage", "heads", "install", "points", "resolve", "runtime", "wrappers"),
)
