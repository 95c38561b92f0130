"""``python -m probes.engines.sglang check``: which capture points the installed SGLang supports (read from its
source, nothing imported), with the SGLang version; exit 1 when a point required by
``VALIDATOR_SGLANG_REQUIRED`` is missing. Shared by ``__main__`` and the launcher's ``--check``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from .points import POINTS
from .resolve import check_points, sglang_root, sglang_version
from .runtime import PluginConfig

__all__ = ["check"]


def check(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.engines.sglang check")
    p.add_argument("--sglang-path", action="append", help="search here for the sglang package (default: sys.path)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    root = sglang_root(a.sglang_path)
    cfg = PluginConfig.from_env()
    statuses = check_points(POINTS, root)
    selected = set(cfg.selected())
    missing_required = [
        s for s in statuses if s.point.name in selected and not s.active and cfg.is_required(s.point.name)
    ]
    if a.json:
        print(
            json.dumps(
                {
                    "sglang": str(root),
                    "version": sglang_version(root),
                    "points": {
                        s.point.name: {
                            **s.to_dict(),
                            "selected": s.point.name in selected,
                            "required": cfg.is_required(s.point.name),
                        }
                        for s in statuses
                    },
                },
                indent=1,
            )
        )
    else:
        print(f"sglang {sglang_version(root)} at {root}")
        for s in statuses:
            flag = "selected" if s.point.name in selected else "off"
            print(f"  [{'ok' if s.active else 'missing':7}] ({flag}) {s.message()}")
    return 1 if missing_required else 0
