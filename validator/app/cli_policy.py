"""The ``validator policy`` commands: ``import-sglang`` writes SGLang comparator ``--diff-threshold`` rules as a
policy file (docs/sglang.md, "Threshold rules"). Local, no store, no torch."""

from __future__ import annotations

import argparse
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

from validator.errors import InputError

__all__ = ["add_commands"]


def cmd_import_sglang(args: argparse.Namespace) -> int:
    from validator.judging.policy import Policy
    from validator.judging.sglang_rules import parse_sglang_rules, policy_toml

    if args.rules and args.diff_threshold is not None:
        raise InputError("give the rules as arguments or after --diff-threshold, not both")
    raw = args.diff_threshold if args.diff_threshold is not None else args.rules
    rules = parse_sglang_rules(raw)
    text = policy_toml(rules, command="--diff-threshold " + " ".join(shlex.quote(a) for a in raw) if raw else "")
    Policy.from_dict(tomllib.loads(text), source="the imported policy")  # what it wrote, read back as --policy reads it
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise InputError(f"{args.output}: cannot write: {exc.strerror or exc}") from None
        print(f"wrote {args.output}: {len(rules)} rule(s)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_commands(sub: Any) -> None:
    """Register ``policy`` on the top-level subparsers."""
    pol = sub.add_parser("policy", help="policy files: import SGLang comparator threshold rules (docs/policy.md)")
    pol_sub = pol.add_subparsers(dest="policy_command", metavar="ACTION")
    pol_sub.required = True
    s = pol_sub.add_parser(
        "import-sglang",
        help="SGLang comparator --diff-threshold rules as a policy file (TOML on stdout)",
        description="RULES as SGLang 0.5.23's comparator takes them after --diff-threshold: one float X (= '.*' "
        "'rel <= X'), or REGEX PREDICATE pairs, first full match wins; none: its default 'rel <= 0.001'. A predicate "
        "compares rel, max_abs, mean_abs with numbers, joined by 'and'/'or'. Each rule becomes a [[rule]] with the "
        "bounds rel_diff_max / max_abs_max / mean_abs_max (docs/sglang.md, 'Threshold rules'). Example: validator "
        "policy import-sglang '.*expert.*' 'rel <= 0.0085 or max_abs <= 1e-3' '.*' 'rel <= 0.0085' > policy.toml",
    )
    s.add_argument("rules", nargs="*", metavar="RULES", help="REGEX PREDICATE pairs, or one float")
    s.add_argument("--diff-threshold", nargs="*", metavar="RULES",
                   help="the same rules after SGLang's own flag, so a command line's part can be pasted as it is")
    s.add_argument("-o", "--output", metavar="POLICY.toml", help="write the policy here instead of stdout")
    s.set_defaults(func=cmd_import_sglang)
