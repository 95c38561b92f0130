"""The ``validator rl`` and ``validator manifest`` commands (docs/rl.md): parse options, read the inputs, judge.

They compute locally (files in, verdict out) and open no store. Neither imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from validator.errors import InputError

__all__ = ["add_commands"]


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1, allow_nan=False))


def _open_service(args: argparse.Namespace) -> Any:
    from validator.service import Service
    from validator.settings import Settings

    conf = Settings.from_env(home=args.home)
    return Service(replace(conf, database_url=args.db) if args.db else conf)


def cmd_rl_kl(args: argparse.Namespace) -> int:
    from validator.service.cycle_collector import cycle_collector_paused

    # a million steps make millions of short-lived objects: the cycle collector would walk them again and again
    with cycle_collector_paused():
        return _rl_kl(args)


def _rl_kl(args: argparse.Namespace) -> int:
    from validator.judging.rl_kl import KLSettings, kl_report
    from validator.runs.logprob_records import read_logprob_jsonl

    try:
        settings = KLSettings(floor=args.floor, floor_steps=args.floor_steps, tolerance=args.tolerance,
                              variation=args.variation)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    path = Path(args.records)
    if path.is_file():
        report = kl_report(read_logprob_jsonl(path), settings)
    elif path.is_dir():  # a bundle whose parts hold logprobs.jsonl
        from validator.runs.sources import open_path

        view = open_path(path)
        if not view.has_logprobs:
            raise InputError(f"{path}: no logprobs.jsonl in this bundle's parts")
        report = kl_report(view.load_logprobs(), settings)
    else:  # a stored run
        svc = _open_service(args)
        try:
            report = svc.rl_kl(args.records, settings)
        finally:
            svc.close()
    if args.json:
        _print_kl_json(report)
    else:
        out = sys.stdout
        for line in report.table_lines():
            out.write(line + "\n")
    return report.exit_code


def _print_kl_json(report: Any, chunk: int = 65536) -> None:
    """The KL document as ``_print_json`` prints it, except each step on one line, written ``chunk`` steps at a
    time: a million steps never exist as a million dicts at once."""
    head = json.dumps(report.to_dict(steps=False), indent=1, allow_nan=False)
    before, after = head.split('\n "steps": [],\n', 1)
    out = sys.stdout
    out.write(before + '\n "steps": [\n')
    n = len(report.table)
    for a in range(0, n, chunk):
        lines = [json.dumps(d, allow_nan=False) for d in report.table.to_dicts(a, a + chunk)]
        out.write("  " + ",\n  ".join(lines) + (",\n" if a + chunk < n else "\n"))
    out.write(" ],\n" + after + "\n")


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise InputError(f"--version must be an int >= 0, got {text!r}")
    return int(text)


def cmd_manifest_write(args: argparse.Namespace) -> int:
    from validator.runs.weight_manifest import manifest_of_safetensors, write_manifest

    m = manifest_of_safetensors(args.paths, version=_version(args.version))
    write_manifest(m, args.output)
    print(f"wrote {args.output}: {len(m.tensors)} tensors" + (f", version {m.version}" if m.version is not None else ""))
    return 0


def cmd_manifest_diff(args: argparse.Namespace) -> int:
    from validator.judging.manifest_diff import DEFAULT_LORA_B, diff_manifests
    from validator.runs.weight_manifest import load_side

    services: list[Any] = []

    def open_run(ref: str) -> Any:  # a name that is no path: a stored run
        if not services:
            services.append(_open_service(args))
        return services[0].resolve(ref, allow_paths=False)

    try:
        a = load_side(args.a, version=_version(args.a_version), open_run=open_run)
        b = load_side(args.b, version=_version(args.b_version), open_run=open_run)
        d = diff_manifests(a, b, lora_b=tuple(args.lora_b) if args.lora_b else DEFAULT_LORA_B, numeric=not args.no_numeric)
    finally:
        for svc in services:
            svc.close()
    if args.json:
        _print_json(d.to_dict())
    else:
        print(d.format_text())
    return d.exit_code


def add_commands(sub: Any) -> None:
    """Register ``rl`` and ``manifest`` on the top-level subparsers."""
    rl = sub.add_parser("rl", help="RL training vs rollout: train/rollout KL over steps (docs/rl.md)")
    rl_sub = rl.add_subparsers(dest="rl_command", metavar="ACTION")
    rl_sub.required = True
    s = rl_sub.add_parser(
        "kl",
        help="k1/k2/k3 KL(rollout || train) per step, floor, trend; exit 0 at floor, 1 above floor or diverging, "
        "3 inconclusive, 2 bad input",
        description="RECORDS: JSONL, one sampled token a line: step, sample_id, token_index, rollout_logprob, "
        "train_logprob, optional weight_version (docs/rl.md); or a bundle whose parts hold logprobs.jsonl, or a "
        "stored run.",
    )
    s.add_argument("records", help="logprob records: a .jsonl file, a bundle directory, or a stored run (name or id)")
    s.add_argument("--floor", type=float, help="declared floor of the k3 step mean (default: estimated from the first steps)")
    s.add_argument("--floor-steps", type=int, default=5, help="steps the floor is estimated from when not declared (default 5)")
    s.add_argument("--tolerance", type=float, default=1.5, help="band: k3 <= tolerance x floor (default 1.5)")
    s.add_argument(
        "--variation", choices=("measured", "sampling"), default="measured",
        help="with an estimated floor, what a step is judged against: 'measured' (default) its sampling error and the "
        "run's own step-to-step variation, so a healthy run whose floor moves from step to step is at floor; "
        "'sampling' its sampling error alone, and the level must be shown inside the band (docs/rl.md)",
    )
    s.add_argument("--json", action="store_true", help="print the verdict document as JSON")
    s.set_defaults(func=cmd_rl_kl)

    man = sub.add_parser("manifest", help="weight-sync manifests: per-tensor dtype, shape, SHA256 (docs/rl.md)")
    man_sub = man.add_subparsers(dest="manifest_command", metavar="ACTION")
    man_sub.required = True
    s = man_sub.add_parser("write", help="hash .safetensors files (or directories of them) into a manifest")
    s.add_argument("paths", nargs="+", metavar="FILES_OR_DIR")
    s.add_argument("-o", "--output", required=True, metavar="MANIFEST.json")
    s.add_argument("--version", help="the weight version to record")
    s.set_defaults(func=cmd_manifest_write)
    s = man_sub.add_parser(
        "diff",
        help="missing/extra/changed tensors, update changed nothing, LoRA B zero at version 1; exit 0 identical "
        "(or an update that changed tensors), 1 differences, 2 bad input",
        description="A and B: manifest files (.json), .safetensors files or directories of them hashed on the fly, "
        "run bundles, or stored runs (then changed tensors are also compared numerically: rel_l2 in float64).",
    )
    s.add_argument("a", help="reference (e.g. the trainer's manifest)")
    s.add_argument("b", help="candidate (e.g. the rollout engine's)")
    s.add_argument("--a-version", help="weight version of A (overrides the manifest's)")
    s.add_argument("--b-version", help="weight version of B (overrides the manifest's)")
    s.add_argument("--lora-b", action="append", metavar="GLOB", help="name glob of LoRA B factors (repeatable; default *lora_B*, *lora_b*)")
    s.add_argument("--no-numeric", action="store_true", help="do not load changed tensors to compare them")
    s.add_argument("--json", action="store_true", help="print the diff document as JSON")
    s.set_defaults(func=cmd_manifest_diff)
