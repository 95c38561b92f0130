"""``python -m probes.engines.sglang.launch [--module M] [--check] -- <arguments of the SGLang server>``.

Puts the plugin's ``sitecustomize`` folder first on ``PYTHONPATH`` and replaces this process with
``python -m sglang.launch_server <arguments>`` (or ``--module``). Every process the server spawns inherits
the variable, so every rank loads the plugin; with no ``VALIDATOR_PROBE_*`` variable set it does nothing.
``--check`` prints which capture points the installed SGLang supports and exits (1 when a required point
is missing).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "site_dir"]


def site_dir() -> str:
    """The folder holding the plugin's ``sitecustomize.py``."""
    return str(Path(__file__).resolve().parent / "sitedir")


def environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    parts = [site_dir()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site_dir()]
    probes_root = str(Path(__file__).resolve().parents[3])  # so that `import probes` works from a checkout
    if probes_root not in parts:
        parts.append(probes_root)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, rest = args[:i], args[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m probes.engines.sglang.launch", description=__doc__.split("\n\n")[1])
    p.add_argument("--module", default="sglang.launch_server", help="module to run (default: sglang.launch_server)")
    p.add_argument("--check", action="store_true", help="report the capture points the installed SGLang supports")
    opts = p.parse_args(args)
    if opts.check:
        from .check import check

        return check([])
    env = environment()
    cmd = [sys.executable, "-m", opts.module, *rest]
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
