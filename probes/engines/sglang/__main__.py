"""``python -m probes.engines.sglang check | coverage BUNDLE | site-dir``.

- ``check [--sglang-path DIR]``: which capture points the installed SGLang supports (read from its
  source, nothing imported), with the SGLang version; exit 1 when a point required by
  ``VALIDATOR_SGLANG_REQUIRED`` is missing.
- ``coverage BUNDLE [--capture-layers 19,37,...]``: the PP capture-coverage check over a bundle's parts.
- ``site-dir``: the folder to put first on ``PYTHONPATH`` to load the plugin without the launcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .check import check
from .coverage import check_coverage, read_reports
from .launch import site_dir


def coverage(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.engines.sglang coverage")
    p.add_argument("bundle")
    p.add_argument("--capture-layers", help="comma-separated layer ids (default: as recorded by the probes)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    layers = [int(x) for x in a.capture_layers.split(",")] if a.capture_layers else None
    res = check_coverage(read_reports(a.bundle), layers)
    if a.json:
        print(
            json.dumps(
                {
                    "ok": res.ok,
                    "capture_layers": list(res.capture_layers),
                    "problems": list(res.problems),
                    "layers": {str(k): v for k, v in res.layers.items()},
                },
                indent=1,
            )
        )
    else:
        print("\n".join(res.lines()))
    return 0 if res.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "check":
        return check(rest)
    if cmd == "coverage":
        return coverage(rest)
    if cmd == "site-dir":
        print(site_dir())
        return 0
    print(f"unknown command {cmd!r}; expected check, coverage or site-dir", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
