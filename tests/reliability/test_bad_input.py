"""Bad input, fuzzed and hand-made: every corrupt file, record or policy is refused with a one-line error
naming the file (and the tensor), the CLI exits 2, and nothing reaches the store."""

from __future__ import annotations

import json
import math
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from probes import BundleWriter, ShardSpec
from probes.core.bundle import BundleError
from probes.core.shards import ShardSpecError
from tests.reliability.helpers import safetensors_bytes, tree
from validator.app.cli import main
from validator.errors import InputError, ValidatorError
from validator.judging.policy import Policy
from validator.runs.acceptance_records import read_acceptance_jsonl
from validator.runs.tensorfile import DTYPES, SafetensorsFile
from validator.service import Service
from validator.settings import Settings

# Deterministic in CI (the same examples each run, no example database written into the work tree).
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("validator: error: "), err
    for n in needles:
        assert n in lines[0], (n, err)


def _store_untouched(home: Path) -> None:
    """No run and no blob: a refused ingest leaves the store as it was."""
    blobs = [p for p in (home / "blobs").rglob("*") if p.is_file()] if (home / "blobs").exists() else []
    assert blobs == [], blobs
    svc = Service(Settings(home=home))
    try:
        assert svc.list_runs() == []
    finally:
        svc.close()


# -- safetensors headers, fuzzed ------------------------------------------------------------------------

_CODES = sorted(DTYPES)


@st.composite
def _valid_file(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 3))
    header: dict[str, Any] = {}
    off = 0
    for i in range(n):
        code = draw(st.sampled_from(_CODES))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        nbytes = math.prod(shape) * DTYPES[code].itemsize
        header[f"t{i}"] = {"dtype": code, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    return safetensors_bytes(header, draw(st.binary(min_size=off, max_size=off)))


_JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True), st.text(max_size=8),
    st.lists(st.integers(-(2**63), 2**63), max_size=4),
)


@st.composite
def _mutated_file(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(_valid_file()))
    (hlen,) = struct.unpack("<Q", raw[:8])
    how = draw(st.sampled_from(["truncate", "flip", "hlen", "field", "extend", "nest"]))
    if how == "truncate":
        return bytes(raw[: draw(st.integers(0, max(0, len(raw) - 1)))])
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= draw(st.integers(1, 255))
        return bytes(raw)
    if how == "hlen":
        raw[:8] = struct.pack("<Q", draw(st.one_of(st.integers(0, 2 * hlen + 16), st.integers(0, 2**64 - 1))))
        return bytes(raw)
    header = json.loads(raw[8 : 8 + hlen])
    data = bytes(raw[8 + hlen :])
    key = draw(st.sampled_from(sorted(header)))
    if how == "field":
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        header[key][field] = draw(st.one_of(_JUNK, st.sampled_from(["F33", "bf16", "", "I128"]),
                                            st.lists(st.integers(-3, 2**62), max_size=5)))
    elif how == "extend":
        header[draw(st.text(min_size=1, max_size=6))] = draw(st.one_of(_JUNK, st.dictionaries(st.text(max_size=12), _JUNK)))
    else:
        header["__metadata__"] = draw(st.one_of(_JUNK, st.recursive(st.integers(), lambda c: st.lists(c, max_size=2), max_leaves=40)))
    return safetensors_bytes(header, data)


@settings(FUZZ, max_examples=300)
@given(blob=st.one_of(_mutated_file(), _valid_file(), st.binary(max_size=64)))
def test_safetensors_reader_never_crashes(blob: bytes) -> None:
    """Whatever the bytes: a validated file whose every tensor loads in bounds, or an InputError naming it."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "fuzz.safetensors"
        p.write_bytes(blob)
        try:
            f = SafetensorsFile(p)
        except InputError as exc:
            assert str(exc).startswith(str(p)), exc
            return
        for key, e in f.entries.items():
            assert 8 <= e.begin <= e.end <= len(blob), key
            t = f.load(key)
            assert tuple(t.shape) == e.shape and t.numel() * t.element_size() == e.nbytes


# -- hand-made bad safetensors through the CLI ------------------------------------------------------------

_F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    "blob, needles",
    [
        (b"", ["shorter than"]),
        (safetensors_bytes({"x": _F32x2}, b"\0" * 8)[:-3], ["tensor 'x'", "truncated"]),
        (safetensors_bytes({"x": _F32x2}, b"\0" * 8, hlen=1 << 20), ["header claims"]),
        (safetensors_bytes({"x": _F32x2}, hlen=(1 << 40)), ["exceeds"]),
        (safetensors_bytes({"x": _F32x2, "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
         ["overlaps"]),
        (safetensors_bytes({"x": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\0"), ["unknown dtype 'F4'"]),
        (safetensors_bytes({"x": {"dtype": "F32", "shape": [0, 2**62, 4], "data_offsets": [0, 0]}}), ["too large"]),
        (struct.pack("<Q", 200_000) + b"[" * 200_000, ["corrupt header"]),
        (safetensors_bytes({"../../etc/passwd": _F32x2}, b"\0" * 8), ["../../etc/passwd"]),
        (safetensors_bytes({"a/b": _F32x2}, b"\0" * 8), ["a/b"]),
        (safetensors_bytes({"a\\b": _F32x2}, b"\0" * 8), ["not allowed"]),
        (safetensors_bytes({"a\0b": _F32x2}, b"\0" * 8), ["not allowed"]),
        (safetensors_bytes({"..%2Fx": _F32x2}, b"\0" * 8), ["..%2Fx"]),
        (safetensors_bytes({"%2e%2e%2fx": _F32x2}, b"\0" * 8), ["%2e%2e%2fx"]),
    ],
    ids=["empty", "truncated-data", "header-beyond-file", "oversized-header", "overlap", "unknown-dtype",
         "shape-overflow", "nested-header", "name-dotdot", "name-slash", "name-backslash", "name-nul",
         "name-urlenc", "name-urlenc-dots"],
)
def test_bad_safetensors_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], blob: bytes, needles: list[str]) -> None:
    home = tmp_path / "home"
    p = tmp_path / "in" / "bad.safetensors"
    p.parent.mkdir()
    p.write_bytes(blob)
    before = tree(tmp_path)
    code, out, err = _cli(capsys, ["--home", str(home), "ingest", str(p)])
    assert code == 2, (out, err)
    _one_line_error(err, "bad.safetensors", *needles)
    _store_untouched(home)
    assert {x for x in tree(tmp_path) - before if not x.startswith("home")} == set()
    # compare reads the same file without a store: the same refusal
    code, _, err = _cli(capsys, ["--home", str(home), "compare", str(p), str(p)])
    assert code == 2
    _one_line_error(err, "bad.safetensors")


# -- bundles: records fuzzed ------------------------------------------------------------------------------


def _bundle(root: Path) -> Path:
    with BundleWriter(root, run_name="fz", part="p0", labels={"k": "v"}) as w:
        w.add("a", torch.arange(6, dtype=torch.float32).reshape(2, 3), step=0, tp_rank=0, tp_size=2,
              shard=ShardSpec.split(0, 0, 2))
        w.add("b", torch.ones(3, dtype=torch.bfloat16), step=0)
    with BundleWriter(root, run_name="fz", part="p1") as w:
        w.add("a", torch.arange(6, 12, dtype=torch.float32).reshape(2, 3), step=0, tp_rank=1, tp_size=2,
              shard=ShardSpec.split(0, 1, 2))
    return root


_FIELDS = ["name", "file", "key", "dtype", "shape", "sha256", "coords", "shard", "nbytes"]
_EVIL = st.sampled_from(
    ["../x", "../../etc/passwd", "/etc/passwd", "a/b", "a\\b", "a\0b", "..%2Fx", "%2e%2e%2f", "..", "",
     "tensors-00000.safetensors/../../x.safetensors", "C:\\x", "t000000", "F32", "float16", "bfloat16"]
)
_VALUES = st.one_of(
    _JUNK, _EVIL, st.lists(st.integers(-2, 8), max_size=4),
    st.dictionaries(st.sampled_from(["kind", "index", "count", "dim", "step", "tokens", "layer", "extra", "tp_rank",
                                     "replica", "replicas", "bogus"]),
                    st.one_of(_JUNK, _EVIL, st.lists(st.integers(-2, 9), max_size=3)), max_size=4),
)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path]]:
    base = tmp_path_factory.mktemp("records")
    svc = Service(Settings(home=base / "home"))
    yield svc, _bundle(base / "src")
    svc.close()


@settings(FUZZ, max_examples=80, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_part_records_fuzzed(fuzz_store: tuple[Service, Path], data: st.DataObject) -> None:
    """Any field of any record replaced by junk or a traversal name: a clean refusal, or a consistent run."""
    import shutil

    svc, src = fuzz_store
    with tempfile.TemporaryDirectory() as d:
        b = Path(d) / "b"
        shutil.copytree(src, b)
        part = data.draw(st.sampled_from(["p0", "p1"]))
        pj = b / "parts" / part / "part.json"
        doc = json.loads(pj.read_text())
        for _ in range(data.draw(st.integers(1, 3))):
            rec = doc["tensors"][data.draw(st.integers(0, len(doc["tensors"]) - 1))]
            field = data.draw(st.sampled_from(_FIELDS))
            if data.draw(st.booleans()):
                rec[field] = data.draw(_VALUES)
            else:
                rec.pop(field, None)
        pj.write_text(json.dumps(doc))
        runs_before = {r.name for r in svc.list_runs(limit=1000)}
        blobs_before = {p.name for p in svc.settings.blob_dir.rglob("*")}
        name = f"fz{len(runs_before)}"
        try:
            run = svc.ingest(b, name=name)
        except (ValidatorError, BundleError, ShardSpecError) as exc:  # the CLI prints these, exit 2
            assert "\n" not in str(exc)
            assert {r.name for r in svc.list_runs(limit=1000)} == runs_before
            assert {p.name for p in svc.settings.blob_dir.rglob("*")} == blobs_before
            return
        shown = svc.show_run(run.name)
        assert shown["n_tensors"] == run.n_tensors
        for t in shown["tensors"]:
            assert ".." not in t["name"] and "/" not in t["name"]
        # every file the store holds is a hash-named blob
        assert all(len(p.parent.name + p.name) == 64 for p in svc.settings.blob_dir.glob("??/*"))


@pytest.mark.parametrize(
    "field, value, needles",
    [
        ("name", "../../evil", ["record 0", "not allowed"]),
        ("name", "a/b", ["not allowed"]),
        ("name", "a\0b", ["not allowed"]),
        ("file", "../../../outside.safetensors", ["bad file name"]),
        ("file", "/etc/passwd", ["bad file name"]),
        ("file", "..\\x.safetensors", ["bad file name"]),
        ("key", "../t000000", ["is not in the file"]),
        ("dtype", "float16", ["tensor 'a'", "float32[2, 3] in the file but float16"]),
        ("shape", [3, 2], ["tensor 'a'", "in the file but"]),
        ("dtype", "complex128", ["unknown dtype"]),
        ("sha256", "0" * 64, ["tensor 'a'", "hash mismatch"]),
    ],
)
def test_bad_records_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, needles: list[str]) -> None:
    b = _bundle(tmp_path / "b")
    outside = tmp_path / "outside.safetensors"
    save_file({"t000000": torch.zeros(2, 3)}, str(outside))  # a real file a traversal would reach
    pj = b / "parts" / "p0" / "part.json"
    doc = json.loads(pj.read_text())
    doc["tensors"][0][field] = value
    pj.write_text(json.dumps(doc))
    home = tmp_path / "home"
    code, out, err = _cli(capsys, ["--home", str(home), "ingest", str(b)])
    assert code == 2, (out, err)
    _one_line_error(err, *needles)
    assert "part.json" in err or "safetensors" in err
    _store_untouched(home)


def test_incomplete_part_and_bad_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = _bundle(tmp_path / "b")
    (b / "parts" / "p1" / "part.json").unlink()  # a writer that crashed
    code, _, err = _cli(capsys, ["--home", str(tmp_path / "h1"), "ingest", str(b)])
    assert code == 2
    _one_line_error(err, "p1", "incomplete part")
    for manifest in ("{", "[]", '{"format": "validator-bundle", "version": 99, "run": {"name": "x"}}',
                     '{"format": "validator-bundle", "version": 1, "run": {"name": ""}}', "[" * 100_000):
        (b / "manifest.json").write_text(manifest)
        code, _, err = _cli(capsys, ["--home", str(tmp_path / "h2"), "ingest", str(b)])
        assert code == 2, manifest[:40]
        _one_line_error(err, "manifest.json")
    _store_untouched(tmp_path / "h1")
    _store_untouched(tmp_path / "h2")


# -- comparisons of mismatched runs: a verdict with reasons, never a crash -------------------------------------


def test_mismatched_runs_compare_to_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nan, inf = float("nan"), float("inf")
    save_file({"shape": torch.zeros(4, 4), "dtype": torch.zeros(3), "empty": torch.zeros(0), "empty2": torch.zeros(0, 3),
               "nan": torch.tensor([1.0, nan, inf, -inf]), "ints": torch.arange(4), "only_a": torch.zeros(1)},
              str(tmp_path / "a.safetensors"))
    save_file({"shape": torch.zeros(4, 5), "dtype": torch.zeros(3, dtype=torch.float16), "empty": torch.zeros(0),
               "empty2": torch.zeros(0, 4), "nan": torch.tensor([nan, nan, -inf, inf]), "ints": torch.arange(4) + 1,
               "only_b": torch.zeros(1)},
              str(tmp_path / "b.safetensors"))
    code, out, err = _cli(capsys, ["--home", str(tmp_path / "h"), "compare", str(tmp_path / "a.safetensors"),
                                   str(tmp_path / "b.safetensors"), "--json"])
    assert code == 1, err
    doc = json.loads(out)
    assert doc["verdict"] == "fail"
    by = {p["name"]: p for p in doc["pairs"]}
    assert by["shape"]["status"] == "error" and "shape mismatch" in " ".join(doc["reasons"])
    assert by["empty2"]["status"] == "error"
    assert by["empty"]["status"] == "pass"
    assert by["nan"]["status"] == "fail" and any("NaN/Inf" in r for r in by["nan"]["reasons"])
    assert by["ints"]["status"] == "fail"
    assert doc["only_a"] == ["only_a"] and doc["only_b"] == ["only_b"]
    # both sides all-NaN / all-Inf and empty: still a decided verdict
    save_file({"x": torch.full((3,), nan), "y": torch.full((2,), inf), "z": torch.zeros(0, 0)}, str(tmp_path / "c.safetensors"))
    code, out, _ = _cli(capsys, ["--home", str(tmp_path / "h"), "compare", str(tmp_path / "c.safetensors"),
                                 str(tmp_path / "c.safetensors"), "--json"])
    assert code in (0, 1, 3) and json.loads(out)["verdict"] in ("pass", "fail", "inconclusive")


# -- acceptance JSONL, fuzzed -----------------------------------------------------------------------------------

_LINE_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c, max_size=4)),
    max_leaves=12,
)


@st.composite
def _acceptance_line(draw: st.DrawFn) -> str:
    rec: dict[str, Any] = {"request_id": "r", "step": draw(st.integers(0, 3)), "proposed": [1, 2, 3], "accepted": 2,
                           "draft_logprobs": [-0.1, -0.2, -0.3]}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["request_id", "step", "proposed", "accepted", "bonus", "draft_logprobs",
                                    "target_tokens", "target_logprobs", "prompt_hash", "output_tokens", "zzz"]))
        if draw(st.booleans()):
            rec[key] = draw(_LINE_VALUES)
        else:
            rec.pop(key, None)
    line = json.dumps(rec)
    how = draw(st.sampled_from(["as-is", "cut", "junk", "huge-int", "deep"]))
    if how == "cut":
        line = line[: draw(st.integers(0, len(line)))]
    elif how == "junk":
        line = draw(st.text(max_size=40))
    elif how == "huge-int":
        line = line.replace('"step": ', '"step": ' + "9" * 5000 + ", \"x\": ", 1)
    elif how == "deep":
        line = '{"request_id": "r", "step": 0, "proposed": ' + "[" * 5000 + "]" * 5000 + ', "accepted": 0}'
    return line.replace("\n", " ")


@settings(FUZZ, max_examples=200)
@given(lines=st.lists(_acceptance_line(), min_size=1, max_size=4))
def test_acceptance_jsonl_fuzzed(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "acc.jsonl"
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            df = read_acceptance_jsonl(p)
        except InputError as exc:
            assert str(exc).startswith(str(p)) and "\n" not in str(exc), exc
            return
        assert len(df) <= len(lines)


def test_malformed_acceptance_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = '{"request_id": "r", "step": 0, "proposed": [1, 2], "accepted": 1}'
    for bad, needle in (("{nope", "line 2"), ('{"request_id": "r", "step": 0, "proposed": [1], "accepted": 5}', "accepted"),
                        ('{"request_id": "r", "step": ' + "1" * 5000 + "}", "line 2"), ("[" * 100_000, "line 2"),
                        ('{"request_id": "r", "step": 1, "proposed": [1], "accepted": 0, "draft_logprobs": [-1' + "0" * 400 + "]}",
                         "draft_logprobs")):
        p = tmp_path / "acc.jsonl"
        p.write_text(good + "\n" + bad + "\n")
        code, _, err = _cli(capsys, ["--home", str(tmp_path / "h"), "compare", str(p), str(p)])
        assert code == 2, (bad[:60], err)
        _one_line_error(err, "acc.jsonl", needle)


# -- policy files -------------------------------------------------------------------------------------------------

_TOML_VALUES = st.one_of(
    st.integers(-5, 5).map(str), st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).replace("inf", "inf")),
    st.sampled_from(['"fail"', '"warn"', '"ignore"', '"*"', "true", "[1, 2]", "{a = 1}", '"x"', "nan", "-inf", "1e400"]),
)


@st.composite
def _policy_text(draw: st.DrawFn) -> str:
    lines = []
    for key in ("missing", "acceptance"):
        if draw(st.booleans()):
            lines.append(f"{key} = {draw(_TOML_VALUES)}")
    for _ in range(draw(st.integers(0, 2))):
        lines.append(draw(st.sampled_from(["[[rule]]", "[rule]", "[acceptance]", "[bogus]"])))
        for _ in range(draw(st.integers(0, 3))):
            key = draw(st.sampled_from(["match", "rel_l2_max", "cosine_min", "max_abs_max", "floor_multiple",
                                        "floor_min_rel_l2", "nonfinite", "bogus"]))
            lines.append(f"{key} = {draw(_TOML_VALUES)}")
    text = "\n".join(lines)
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))] + draw(st.text(max_size=5))
    return text


@settings(FUZZ, max_examples=200)
@given(text=_policy_text())
def test_policy_files_fuzzed(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "policy.toml"
        p.write_text(text, encoding="utf-8")
        try:
            pol = Policy.load(p)
        except InputError as exc:
            assert str(exc).startswith(str(p)) and "\n" not in str(exc).strip(), exc
            return
        for r in pol.rules:
            for v in (r.rel_l2_max, r.cosine_min, r.max_abs_max, r.floor_multiple):
                assert v is None or (math.isfinite(v) and v >= 0)


@pytest.mark.parametrize(
    "text, needle",
    [("[[rule]\nmatch=1", "not valid TOML"), ("[[rule]]\nrel_l2_max = -1", "non-negative"), ("[[rule]]\nrel_l2_max = nan", "non-negative"),
     ("[[rule]]\nmatch = 3", "match must be a string"), ('missing = "maybe"', "missing must be"), ("[[rule]]\nfoo = 1", "unknown rule key"),
     ("a = " + "[" * 50_000, "not valid TOML"), ("rule = 5", "must be tables"), ("\xff\xfe", "not valid TOML"),
     ("acceptance = 5", "[acceptance] must be a table")],
)
def test_bad_policy_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str) -> None:
    save_file({"x": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    pol = tmp_path / "bad-policy.toml"
    pol.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    a = str(tmp_path / "a.safetensors")
    code, _, err = _cli(capsys, ["--home", str(tmp_path / "h"), "compare", a, a, "--policy", str(pol)])
    assert code == 2, err
    _one_line_error(err, "bad-policy.toml", needle)
