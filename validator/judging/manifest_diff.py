"""Diff two weight manifests (docs/rl.md, "Weight manifests"): missing, extra and changed tensors, "update
changed nothing", the LoRA-B-at-version-1 check, and rel_l2 of changed tensors when both sides have the files.

A is the reference (e.g. the trainer's export), B the candidate (e.g. what the rollout engine loaded). When both
sides carry a weight version and they differ, B is an *update* of A: changed tensors are then expected, and an
update that changed no tensor is the failure.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from validator.errors import InputError
from validator.judging.exit_codes import VERDICT_EXIT
from validator.numerics.jsonsafe import json_safe
from validator.runs.weight_manifest import ManifestTensor, WeightManifest

__all__ = ["DEFAULT_LORA_B", "MAX_LORA_B_BYTES", "ManifestDiff", "diff_manifests", "zero_sha256", "zero_sha256s"]

DiffVerdict = Literal["identical", "updated", "different"]
DEFAULT_LORA_B = ("*lora_B*", "*lora_b*")
# The largest LoRA B factor the version-1 zero check accepts. A B factor is out_features x rank: the largest in
# practice, an lm_head's (vocab 262,144 at rank 1,024) or a fused-MoE stack's (256 experts x 7,168 x 128), in
# float32, is under 1 GiB. Its zero hash is computed, not looked up (SHA256 has no shortcut for n zero bytes):
# about 1 s per GiB on one core, so the check costs at most ~2 s per diff (all sizes in one pass), refused above.
MAX_LORA_B_BYTES = 2 << 30
_ZERO_CHUNK = memoryview(bytes(1 << 20))


@functools.lru_cache(maxsize=1024)
def zero_sha256(nbytes: int) -> str:
    """SHA256 of ``nbytes`` zero bytes: the hash of an all-(+0) tensor of any dtype (at most MAX_LORA_B_BYTES)."""
    return zero_sha256s([nbytes])[nbytes]


def zero_sha256s(sizes: Iterable[int]) -> dict[int, str]:
    """SHA256 of n zero bytes for each n of ``sizes``, in one pass over the largest (a copy of the running hash
    at each size): the work is that of the largest size, however many sizes. ValueError above MAX_LORA_B_BYTES."""
    wanted = sorted(set(sizes))
    if wanted and not 0 <= wanted[0] <= wanted[-1] <= MAX_LORA_B_BYTES:
        raise ValueError(f"zero hash of {wanted[0] if wanted[0] < 0 else wanted[-1]} bytes: sizes are 0 to {MAX_LORA_B_BYTES}")
    out: dict[int, str] = {}
    h, done = hashlib.sha256(), 0
    for n in wanted:
        while done < n:
            step = min(n - done, len(_ZERO_CHUNK))
            h.update(_ZERO_CHUNK[:step])
            done += step
        out[n] = h.copy().hexdigest()
    return out


def side_version(m: WeightManifest) -> int | None:
    """The manifest's version, else the one version all its tensors share, else None."""
    if m.version is not None:
        return m.version
    vs = {t.version for t in m.tensors.values()}
    return vs.pop() if len(vs) == 1 else None


@dataclass(frozen=True)
class TensorChange:
    name: str
    kind: Literal["content", "dtype", "shape"]
    a: ManifestTensor
    b: ManifestTensor
    numeric: dict[str, Any] | None = None  # rel_l2, max_abs, conversion (when both sides had the tensors)

    def to_dict(self) -> dict[str, Any]:
        num = None if self.numeric is None else json_safe(self.numeric)
        return {"name": self.name, "kind": self.kind, "a": self.a.to_dict(), "b": self.b.to_dict(), "numeric": num}


@dataclass(frozen=True)
class ManifestDiff:
    verdict: DiffVerdict
    reasons: tuple[str, ...]
    a_source: str
    b_source: str
    a_version: int | None
    b_version: int | None
    update: bool
    missing: tuple[str, ...]  # in A, not in B
    extra: tuple[str, ...]  # in B, not in A
    changed: tuple[TensorChange, ...]
    unchanged: int
    lora_b: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "manifest_diff",
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "a": {"source": self.a_source, "version": self.a_version},
            "b": {"source": self.b_source, "version": self.b_version},
            "update": self.update,
            "missing": list(self.missing),
            "extra": list(self.extra),
            "changed": [c.to_dict() for c in self.changed],
            "unchanged": self.unchanged,
            "lora_b": self.lora_b,
        }

    def format_text(self, limit: int = 50) -> str:
        from validator.judging.text import fmt_num, format_rows

        lines = [f"A: {self.a_source} (version {self.a_version})", f"B: {self.b_source} (version {self.b_version})", ""]
        for title, names in (("missing in B", self.missing), ("extra in B", self.extra)):
            if names:
                lines.append(f"{title} ({len(names)}): " + ", ".join(names[:limit]) + (" ..." if len(names) > limit else ""))
        if self.changed:
            rows = []
            for c in self.changed[:limit]:
                num = c.numeric or {}
                rows.append([
                    c.name, c.kind, f"{c.a.dtype}{list(c.a.shape)}", f"{c.b.dtype}{list(c.b.shape)}",
                    fmt_num(num.get("rel_l2")), str(num.get("conversion", "-")),
                ])
            lines.append(format_rows(["changed tensor", "what", "A", "B", "rel_l2", "compared as"], rows))
            if len(self.changed) > limit:
                lines.append(f"... and {len(self.changed) - limit} more")
        lines.append(f"unchanged: {self.unchanged}")
        lines.append(f"verdict: {self.verdict.upper()}")
        lines.extend(f"  {r}" for r in self.reasons)
        return "\n".join(lines)


def _is_lora_b(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _lora_names(m: WeightManifest, patterns: tuple[str, ...]) -> list[str]:
    """The LoRA B factors at version 1, each refused (naming the side and tensor) above MAX_LORA_B_BYTES."""
    names = [n for n in m.tensors if _is_lora_b(n, patterns) and m.tensor_version(n) == 1]
    for n in names:
        if m.tensors[n].nbytes > MAX_LORA_B_BYTES:
            t = m.tensors[n]
            raise InputError(
                f"{m.source}, tensor {n!r}: a LoRA B factor of {t.dtype}{list(t.shape)} is {t.nbytes} bytes, more than "
                f"the {MAX_LORA_B_BYTES} ({MAX_LORA_B_BYTES >> 30} GiB) the version-1 zero check accepts (docs/rl.md)"
            )
    return names


def _lora_check(m: WeightManifest, names: list[str], zeros: dict[int, str]) -> dict[str, Any]:
    """At version 1 every LoRA B factor must be zero (the adapter starts as a no-op)."""
    nonzero = [n for n in names if m.tensors[n].sha256 != zeros[m.tensors[n].nbytes]]
    return {"checked": len(names), "nonzero": sorted(nonzero)}


def _numeric(a: WeightManifest, b: WeightManifest, name: str) -> dict[str, Any] | None:
    la, lb = a.loaders.get(name), b.loaders.get(name)
    if la is None or lb is None:
        return None
    from validator.numerics.metrics import compare_tensors  # imports torch: only for a numeric comparison

    ta, tb = la(), lb()
    m = compare_tensors(ta, tb)
    da, db = a.tensors[name].dtype, b.tensors[name].dtype
    return {
        "rel_l2": m.rel_l2,
        "max_abs": m.max_abs,
        "conversion": f"{da} -> float64" if da == db else f"{da} and {db} -> float64",
        "nonfinite_a": m.nonfinite_a,
        "nonfinite_b": m.nonfinite_b,
    }


def diff_manifests(
    a: WeightManifest,
    b: WeightManifest,
    *,
    lora_b: tuple[str, ...] = DEFAULT_LORA_B,
    numeric: bool = True,
) -> ManifestDiff:
    """Compare two manifests. ``lora_b``: name globs of LoRA B factors (checked on any side at version 1).
    Sizes are checked before any work: a LoRA B factor above MAX_LORA_B_BYTES is an InputError."""
    lora_names = {"A": _lora_names(a, lora_b), "B": _lora_names(b, lora_b)}
    va, vb = side_version(a), side_version(b)
    update = va is not None and vb is not None and va != vb
    missing = tuple(sorted(set(a.tensors) - set(b.tensors)))
    extra = tuple(sorted(set(b.tensors) - set(a.tensors)))
    changed: list[TensorChange] = []
    unchanged = 0
    for name in sorted(set(a.tensors) & set(b.tensors)):
        ta, tb = a.tensors[name], b.tensors[name]
        if ta.shape != tb.shape:
            changed.append(TensorChange(name, "shape", ta, tb))
        elif ta.dtype != tb.dtype:
            changed.append(TensorChange(name, "dtype", ta, tb, _numeric(a, b, name) if numeric else None))
        elif ta.sha256 != tb.sha256:
            changed.append(TensorChange(name, "content", ta, tb, _numeric(a, b, name) if numeric else None))
        else:
            unchanged += 1
    reasons: list[str] = []
    failed = False
    if missing:
        failed = True
        reasons.append(f"{len(missing)} tensor(s) of A missing in B, e.g. {missing[0]!r}")
    if extra:
        failed = True
        reasons.append(f"{len(extra)} tensor(s) in B not in A, e.g. {extra[0]!r}")
    layout = [c for c in changed if c.kind != "content"]
    if layout:
        failed = True
        c = layout[0]
        reasons.append(
            f"{len(layout)} tensor(s) changed dtype or shape, e.g. {c.name!r}: {c.a.dtype}{list(c.a.shape)} -> {c.b.dtype}{list(c.b.shape)}"
        )
    content = [c for c in changed if c.kind == "content"]
    if update:
        if not changed:
            failed = True
            reasons.append(f"update changed nothing: version {va} -> {vb}, and all {unchanged} tensors are bitwise identical")
        else:
            reasons.append(f"update {va} -> {vb}: {len(changed)} tensor(s) changed, {unchanged} unchanged")
    elif content:
        failed = True
        worst = max(content, key=lambda c: float((c.numeric or {}).get("rel_l2", 0.0)))
        rel = f" (largest rel_l2 {worst.numeric['rel_l2']:.3g} at {worst.name!r})" if worst.numeric else ""
        reasons.append(f"{len(content)} tensor(s) differ in content, e.g. {content[0].name!r}{rel}")
    sides = {"A": a, "B": b}
    zeros = zero_sha256s(sides[k].tensors[n].nbytes for k, names in lora_names.items() for n in names)
    checks = {k: _lora_check(sides[k], names, zeros) for k, names in lora_names.items()}
    for side, chk in checks.items():
        if chk["nonzero"]:
            failed = True
            reasons.append(
                f"{side}: {len(chk['nonzero'])} of {chk['checked']} LoRA B factor(s) not zero at version 1, e.g. {chk['nonzero'][0]!r}"
            )
        elif chk["checked"]:
            reasons.append(f"{side}: all {chk['checked']} LoRA B factor(s) zero at version 1")
    verdict: DiffVerdict = "different" if failed else ("updated" if update else "identical")
    if verdict == "identical":
        reasons.insert(0, f"identical: {unchanged} tensors, same dtype, shape and SHA256")
    return ManifestDiff(
        verdict=verdict,
        reasons=tuple(reasons),
        a_source=a.source,
        b_source=b.source,
        a_version=va,
        b_version=vb,
        update=update,
        missing=missing,
        extra=extra,
        changed=tuple(changed),
        unchanged=unchanged,
        lora_b={"patterns": list(lora_b), **{side: chk for side, chk in checks.items()}},
    )

