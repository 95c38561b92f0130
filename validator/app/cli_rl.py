"""The ``validator rl`` and ``validator manifest`` commands (docs/rl.md): parse options, read the inputs, judge.

They compute locally (files in, verdict out) and open no store. Neither imports torch.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from validator.errors import InputError

__all__ = ["add_commands"]


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1, allow_nan=False))


def cmd_rl_kl(args: argparse.Namespace) -> int:
    from validator.judging.rl_kl import KLSettings, kl_report
    from validator.runs.logprob_records import read_logprob_jsonl

    try:
        settings = KLSettings(floor=args.floor, floor_steps=args.floor_steps, tolerance=args.tolerance)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    report = kl_report(read_logprob_jsonl(args.records), settings)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.format_table())
    return report.exit_code


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
        "train_logprob, optional weight_version (docs/rl.md).",
    )
    s.add_argument("records", help="logprob records (.jsonl)")
    s.add_argument("--floor", type=float, help="declared floor of the k3 step mean (default: estimated from the first steps)")
    s.add_argument("--floor-steps", type=int, default=5, help="steps the floor is estimated from when not declared (default 5)")
    s.add_argument("--tolerance", type=float, default=1.5, help="band: k3 <= tolerance x floor (default 1.5)")
    s.add_argument("--json", action="store_true", help="print the verdict document as JSON")
    s.set_defaults(func=cmd_rl_kl)
