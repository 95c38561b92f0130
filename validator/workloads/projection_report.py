"""The projection report: runs the projection probe and compares its paths capture point by capture point.

Pairs compared (``a`` = reference, ``b`` = candidate, metrics from :func:`validator.numerics.metrics.compare_tensors`):

- every path against ``ref`` (float64): the error each path carries;
- every ``partial-*`` path against ``concat``: what pipeline-parallel accumulation adds on top of the
  single-GEMM deployment (PP1 / SGLang main).

Capture points: ``ctx.pre_norm``, ``ctx.normed``, ``draft.k[i]`` and ``draft.v[i]`` for each draft layer.
Against ``ref`` each row also gives ``x floor``: its rel_l2 over concat's rel_l2 at the same point (the
deployed single GEMM sets the floor), and the ULP distance from the float64 result rounded to the
candidate's dtype. The stage view compares each partial path's running sum after every stage with the
float64 running sum. Needs torch (and numpy-free ``validator.numerics.metrics``) only: no store, no server.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probes.workloads.projection import (
    HIDDEN_NAME,
    ProbeRun,
    ProjectionConfig,
    ProjectionConfigError,
    load_hidden_states,
    parse_pp_split,
    run_probe,
)
from validator.numerics.metrics import TensorMetrics, compare_tensors

__all__ = [
    "TOLERANCES",
    "Comparison",
    "ProjectionReport",
    "StageComparison",
    "add_arguments",
    "build_report",
    "config_from_args",
    "format_table",
    "main",
    "run_from_args",
    "run_projection_report",
]


@dataclass(frozen=True)
class Comparison:
    candidate: str
    reference: str
    point: str
    metrics: TensorMetrics
    floor_ratio: float | None = None  # rel_l2 / rel_l2(concat vs ref) at this point; vs-ref rows only
    ulp_vs_rounded_ref: tuple[int | None, int | None] | None = None  # (max, p99) vs ref rounded to b's dtype

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "candidate": self.candidate,
            "reference": self.reference,
            "point": self.point,
            "metrics": self.metrics.to_dict(),
            "floor_ratio": self.floor_ratio,
        }
        if self.ulp_vs_rounded_ref is not None:
            d["ulp_vs_rounded_ref"] = {"max": self.ulp_vs_rounded_ref[0], "p99": self.ulp_vs_rounded_ref[1]}
        return d


@dataclass(frozen=True)
class StageComparison:
    candidate: str
    stage: int
    capture_layers: tuple[int, ...]
    metrics: TensorMetrics  # running sum after this stage vs the float64 running sum

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "stage": self.stage,
            "capture_layers": list(self.capture_layers),
            "metrics": self.metrics.to_dict(),
        }


@dataclass
class ProjectionReport:
    run: dict[str, Any]  # config, layout, kernels, environment, inputs, paths, handoff bytes, bundles
    comparisons: list[Comparison] = field(default_factory=list)
    stage_view: list[StageComparison] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """False when any comparison has non-finite values where its reference has finite ones."""
        return all(c.metrics.nonfinite_mismatch == 0 for c in self.comparisons)

    def __bool__(self) -> bool:
        return self.ok

    def pairs(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((c.candidate, c.reference) for c in self.comparisons))

    def summary(self) -> list[dict[str, Any]]:
        """Per pair: the context points and the worst draft K and V layer (by rel_l2)."""
        out = []
        for cand, ref in self.pairs():
            rows = [c for c in self.comparisons if (c.candidate, c.reference) == (cand, ref)]
            entry: dict[str, Any] = {"candidate": cand, "reference": ref}
            for label, prefix in (
                ("pre_norm", "ctx.pre_norm"),
                ("normed", "ctx.normed"),
                ("k_worst", "draft.k"),
                ("v_worst", "draft.v"),
            ):
                sel = [c for c in rows if c.point.startswith(prefix)]
                if sel:
                    worst = max(sel, key=lambda c: c.metrics.rel_l2)
                    entry[label] = {
                        "point": worst.point,
                        "rel_l2": worst.metrics.rel_l2,
                        "cosine": worst.metrics.cosine,
                        "max_abs": worst.metrics.max_abs,
                        "floor_ratio": worst.floor_ratio,
                    }
            out.append(entry)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": "projection",
            "ok": self.ok,
            **self.run,
            "summary": self.summary(),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "stage_view": [s.to_dict() for s in self.stage_view],
        }


def _points(n_draft: int) -> list[str]:
    return ["ctx.pre_norm", "ctx.normed"] + [f"draft.{kv}[{i}]" for i in range(n_draft) for kv in ("k", "v")]


def _tensor_at(res: Any, point: str) -> torch.Tensor:
    if point == "ctx.pre_norm":
        return res.pre_norm  # type: ignore[no-any-return]
    if point == "ctx.normed":
        return res.normed  # type: ignore[no-any-return]
    kind, idx = point.removeprefix("draft.").rstrip("]").split("[")
    return (res.k if kind == "k" else res.v)[int(idx)]  # type: ignore[no-any-return]


def _ulp_spec_ok(dt: torch.dtype) -> bool:
    return dt in (torch.bfloat16, torch.float16, torch.float32)


# torch.testing.assert_close's default tolerances per dtype; they set pass_ratio only.
TOLERANCES: dict[str, tuple[float, float]] = {
    "bf16": (1e-5, 1.6e-2),
    "fp16": (1e-5, 1e-3),
    "fp32": (1e-5, 1.3e-6),
    "fp64": (1e-7, 1e-7),
}


def build_report(run: ProbeRun, *, atol: float | None = None, rtol: float | None = None) -> ProjectionReport:
    """Compare the paths of a finished probe run (pure: tensors in, metrics out).

    ``atol``/``rtol`` (for ``pass_ratio``) default to torch.testing's tolerances for the model dtype.
    """
    d_atol, d_rtol = TOLERANCES[run.config.to_dict()["dtype"]]
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    names = list(run.paths)
    pairs = [(p, "ref") for p in names if p != "ref" and "ref" in names]
    pairs += [(p, "concat") for p in names if p.startswith("partial-") and "concat" in names]
    points = _points(run.config.draft_layers)
    report = ProjectionReport(run=_run_info(run))
    report.run["tolerances"] = {"atol": atol, "rtol": rtol, "used_for": "pass_ratio"}
    floor: dict[str, float] = {}
    for cand, ref in pairs:
        rc, rr = run.paths[cand], run.paths[ref]
        for pt in points:
            a, b = _tensor_at(rr, pt), _tensor_at(rc, pt)
            m = compare_tensors(a, b, atol=atol, rtol=rtol, p99=True)
            ulp = None
            if a.dtype != b.dtype and _ulp_spec_ok(b.dtype):
                mu = compare_tensors(a.to(b.dtype), b, atol=atol, rtol=rtol, p99=True)
                ulp = (mu.max_ulp, mu.p99_ulp)
            ratio = None
            if ref == "ref":
                if cand == "concat":
                    floor[pt] = m.rel_l2
                if pt in floor and floor[pt] > 0:
                    ratio = m.rel_l2 / floor[pt]
            report.comparisons.append(Comparison(cand, ref, pt, m, ratio, ulp))
    if "ref" in names:
        ref_stages = run.paths["ref"].stages
        for p in names:
            if not p.startswith("partial-"):
                continue
            for so, rs in zip(run.paths[p].stages, ref_stages):
                plan = run.layout.stages[so.stage]
                report.stage_view.append(
                    StageComparison(
                        p,
                        so.stage,
                        plan.capture_layers,
                        compare_tensors(rs.running, so.running, atol=atol, rtol=rtol),
                    )
                )
    return report


def _run_info(run: ProbeRun) -> dict[str, Any]:
    return {
        "config": run.config.to_dict(),
        "layout": run.layout.to_dict(),
        "kernels": run.kernels.describe(),
        "environment": run.environment,
        "inputs": run.input_source,
        "paths": {
            n: {
                "compute_dtype": r.compute_dtype,
                "accum_dtype": r.accum_dtype,
                "kernels": r.kernels,
                "seconds": round(r.seconds, 4),
            }
            for n, r in run.paths.items()
        },
        "handoff_bytes": run.handoff,
        "bundles": dict(run.bundles),
    }


def run_projection_report(
    config: ProjectionConfig,
    out_dir: str | Path | None = None,
    *,
    device: str = "auto",
    paths: Sequence[str] | None = None,
    kernels: str = "auto",
    from_bundle: str | Path | None = None,
    hidden_name: str = HIDDEN_NAME,
    step: int | None = None,
    write_bundles: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
) -> ProjectionReport:
    """Run the probe (bundles under ``out_dir/<path>/`` unless ``write_bundles`` is False) and compare.

    With ``from_bundle`` the hidden states come from a captured bundle (see
    :func:`probes.workloads.projection.load_hidden_states`); tokens and hidden size are taken from it.
    Raises :class:`probes.workloads.projection.ProjectionConfigError` for an impossible layout, before any arithmetic.
    """
    hidden = None
    source = None
    if from_bundle is not None:
        hidden = load_hidden_states(from_bundle, config.capture_layers, name=hidden_name, step=step)
        source = f"bundle {from_bundle} ({hidden_name})"
    run = run_probe(
        config,
        out_dir if write_bundles else None,
        device=device,
        paths=paths,
        kernels=kernels,
        hidden=hidden,
        input_source=source,
    )
    report = build_report(run, atol=atol, rtol=rtol)
    del run
    return report


# -- formatting --------------------------------------------------------------------------------


def _e(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def format_table(report: ProjectionReport) -> str:
    r = report.run
    cfg, lay = r["config"], r["layout"]
    env = r["environment"]
    lines = [
        (
            f"Projection probe: hidden {cfg['hidden']}, {cfg['layers']} layers, capture {cfg['capture_layers']}, "
            f"PP{cfg['pp']} split {','.join(map(str, lay['sizes']))} ({lay['split']}), {cfg['draft_layers']} draft "
            f"layers x {cfg['kv_heads']} KV heads x {cfg['head_dim']}, tokens {cfg['tokens']}, {cfg['dtype']}, "
            f"seed {cfg['seed']}, inputs {r['inputs']}"
        ),
        f"device {env.get('gpu', env['device'])}, torch {env['torch']}"
        + (f", CUDA {env['cuda']}" if env.get("cuda") else "")
        + f", kernels rmsnorm={r['kernels']['rmsnorm']} rope={r['kernels']['rope']}"
        + (f" ({env['kernels_note']})" if env.get("kernels_note") else ""),
        "stages: "
        + "  ".join(
            f"{s['stage']}:[{s['layers'][0]},{s['layers'][1]})"
            + ("<-" + ",".join(map(str, s["capture_layers"])) if s["capture_layers"] else " pass")
            for s in lay["stages"]
        ),
        "",
        "Summary (worst draft layer by rel_l2; x floor = rel_l2 / rel_l2(concat vs ref)):",
        "",
        (
            "| candidate | reference | pre_norm rel_l2 | normed rel_l2 | normed cosine | K worst rel_l2 | V worst rel_l2 "
            "| K x floor | V x floor |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report.summary():
        k, v = s.get("k_worst", {}), s.get("v_worst", {})
        fr_k, fr_v = k.get("floor_ratio"), v.get("floor_ratio")
        lines.append(
            f"| {s['candidate']} | {s['reference']} | {_e(s['pre_norm']['rel_l2'])} | {_e(s['normed']['rel_l2'])} "
            f"| {s['normed']['cosine']:.8f} | {_e(k.get('rel_l2'))} ({k.get('point', '-')}) "
            f"| {_e(v.get('rel_l2'))} ({v.get('point', '-')}) "
            f"| {'-' if fr_k is None else f'{fr_k:.2f}'} | {'-' if fr_v is None else f'{fr_v:.2f}'} |"
        )
    lines += [
        "",
        "Per capture point:",
        "",
        (
            "| candidate | reference | point | rel_l2 | cosine | max_abs | sqnr_db | pass_ratio | x floor "
            "| ulp max/p99 |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report.comparisons:
        m = c.metrics
        ulp = c.ulp_vs_rounded_ref or ((m.max_ulp, m.p99_ulp) if m.max_ulp is not None else None)
        lines.append(
            f"| {c.candidate} | {c.reference} | {c.point} | {_e(m.rel_l2)} | {m.cosine:.8f} | {_e(m.max_abs)} "
            f"| {m.sqnr_db:.1f} | {m.pass_ratio:.4f} | {'-' if c.floor_ratio is None else f'{c.floor_ratio:.2f}'} "
            f"| {'-' if ulp is None else f'{ulp[0]}/{ulp[1]}'} |"
        )
    if report.stage_view:
        cands = list(dict.fromkeys(s.candidate for s in report.stage_view))
        lines += [
            "",
            "Stage view: running sum after each stage vs the float64 running sum (rel_l2):",
            "",
            "| stage | capture | " + " | ".join(cands) + " |",
            "|---|---|" + "---|" * len(cands),
        ]
        for st in lay["stages"]:
            vals = [
                next(s for s in report.stage_view if s.candidate == c and s.stage == st["stage"])
                for c in cands
            ]
            cap = ",".join(map(str, st["capture_layers"])) or "(pass on)"
            lines.append(
                f"| {st['stage']} | {cap} | " + " | ".join(_e(v.metrics.rel_l2) for v in vals) + " |"
            )
    hb = r["handoff_bytes"]
    lines += [
        "",
        (
            f"PP hand-off of the running sum ({hb['tokens']} tokens x {hb['hidden']}; "
            f"{hb['boundaries_carrying_sum']} of {hb['boundaries']} stage boundaries carry a non-zero sum):"
        ),
        "",
        "| accumulation | bytes/token/stage | per hand-off | per chunk (all carrying boundaries) |",
        "|---|---|---|---|",
    ]
    for acc in ("bf16", "fp32"):
        h = hb[acc]
        lines.append(
            f"| {acc} | {h['bytes_per_token_per_stage']:,} | {_mb(h['bytes_per_handoff'])} "
            f"| {_mb(h['bytes_per_chunk_all_boundaries'])} |"
        )
    lines.append(
        f"(forwarding the raw features instead: {hb['raw_features_instead_bytes_per_token']:,} bytes/token)"
    )
    secs = ", ".join(f"{n} {p['seconds']:.2f}s" for n, p in r["paths"].items())
    lines += ["", f"path wall time: {secs}"]
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``validator probe projection``. Defaults: Kimi-K3 + DFlash draft, PP8, 8192 tokens, bf16."""
    d = ProjectionConfig()
    g = parser.add_argument_group("shapes")
    g.add_argument("--hidden", type=int, default=d.hidden, help="target hidden size (default %(default)s)")
    g.add_argument("--layers", type=int, default=d.layers, help="target layers (default %(default)s)")
    g.add_argument(
        "--capture-layers",
        type=_int_list,
        default=d.capture_layers,
        help="capture layer ids in feature order, e.g. 19,37,54,66,78,90",
    )
    g.add_argument("--pp", type=int, default=d.pp, help="pipeline stages (default %(default)s)")
    g.add_argument(
        "--pp-split",
        default=None,
        help="layers per stage ('12,12,12,12,12,11,11,11') or ranges ('0:12,12:24,...'); "
        "default: even split, first stages take the remainder",
    )
    g.add_argument("--draft-layers", type=int, default=d.draft_layers)
    g.add_argument("--kv-heads", type=int, default=d.kv_heads)
    g.add_argument("--head-dim", type=int, default=d.head_dim)
    g.add_argument("--rope-theta", type=float, default=d.rope_theta)
    g.add_argument("--eps", type=float, default=d.eps)
    g.add_argument("--tokens", type=int, default=d.tokens)
    g.add_argument(
        "--dtype", default=d.dtype, help="model dtype: bf16, fp16, fp32, fp64 (default %(default)s)"
    )
    g.add_argument("--seed", type=int, default=d.seed)
    r = parser.add_argument_group("run")
    r.add_argument(
        "--paths",
        default=None,
        help="comma-separated paths (default: concat,partial-<dtype>,partial-fp32,ref)",
    )
    r.add_argument(
        "--kernels",
        choices=("auto", "torch", "flashinfer"),
        default="auto",
        help="RMSNorm/RoPE kernels for the non-float64 paths (default: flashinfer on CUDA if importable)",
    )
    r.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    r.add_argument(
        "--out", default=None, help="write one bundle per path under OUT/<path>/ and report.{json,md}"
    )
    r.add_argument("--no-bundles", action="store_true", help="with --out: write only the report files")
    r.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    r.add_argument(
        "--from-bundle",
        default=None,
        help=f"take hidden states from a captured bundle: tensors named {HIDDEN_NAME!r}, coords layer=<id>",
    )
    r.add_argument("--hidden-name", default=HIDDEN_NAME, help="tensor name to read with --from-bundle")
    r.add_argument("--step", type=int, default=None, help="with --from-bundle: the step to read")
    r.add_argument("--atol", type=float, default=None, help="pass_ratio tolerance (default: per dtype)")
    r.add_argument("--rtol", type=float, default=None, help="pass_ratio tolerance (default: per dtype)")


def config_from_args(args: argparse.Namespace) -> ProjectionConfig:
    split = parse_pp_split(args.pp_split) if args.pp_split else None
    dtype = args.dtype
    return ProjectionConfig(
        hidden=args.hidden,
        layers=args.layers,
        capture_layers=tuple(args.capture_layers),
        pp=args.pp,
        pp_split=split,
        draft_layers=args.draft_layers,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        rope_theta=args.rope_theta,
        eps=args.eps,
        tokens=args.tokens,
        dtype=dtype,
        seed=args.seed,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Exit code: 0 done, 1 non-finite values appeared where the reference is finite, 2 bad configuration."""
    try:
        cfg = config_from_args(args)
        paths = [p.strip() for p in args.paths.split(",")] if args.paths else None
        report = run_projection_report(
            cfg,
            args.out,
            device=args.device,
            paths=paths,
            kernels=args.kernels,
            from_bundle=args.from_bundle,
            hidden_name=args.hidden_name,
            step=args.step,
            write_bundles=not args.no_bundles,
            atol=args.atol,
            rtol=args.rtol,
        )
    except ProjectionConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = format_table(report)
    data = report.to_dict()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
        (out / "report.md").write_text(table + "\n")
    print(json.dumps(data, indent=1) if args.json else table)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validator.workloads.projection_report", description=__doc__.split("\n")[0]
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
