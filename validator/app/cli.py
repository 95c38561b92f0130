"""The ``validator`` command. Each command parses its options and calls the service; nothing else."""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NoReturn

from probes.core.bundle import BundleError
from probes.core.config import ProbeConfigError
from probes.core.shards import ShardSpecError
from validator.errors import InputError, ValidatorError
from validator.judging.exit_codes import EXIT_INPUT_ERROR, VERDICT_EXIT
from validator.judging.text import format_rows
from validator.settings import ClientSettings, Settings, parse_labels

__all__ = ["main", "entry", "build_parser"]




@contextmanager
def _progress(desc: str, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on a terminal; nothing when output is redirected or --json is given."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit="tensor", file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


_open_services: list[Any] = []  # closed when the command returns: its connections (and SQLite's WAL files) go then


def _service(args: argparse.Namespace) -> Any:
    from validator.service import Service

    settings = Settings.from_env(home=args.home)
    svc = Service(replace(settings, database_url=args.db) if args.db else settings)
    _open_services.append(svc)
    return svc


def _close_services() -> None:
    while _open_services:
        _open_services.pop().close()


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1, default=str))


# -- commands ----------------------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    svc = _service(args)
    with _progress("ingest", not args.json) as prog:
        if getattr(args, "format", "auto") == "sglang-dumper":
            from validator.runs.dumper import read_dumper_dir

            split = {}
            for item in args.split or []:
                pat, sep, dim = item.rpartition("=")
                if not sep or not pat or not dim.lstrip("-").isdigit():
                    raise InputError(f"--split {item!r} must be NAME_GLOB=DIM")
                split[pat] = int(dim)
            view = read_dumper_dir(args.path, split=split, max_file_bytes=args.max_file_bytes)
            for problem in view.manifest["sglang_dumper"]["unassembled"]:  # kept per rank: say why (docs/sglang.md)
                print(f"validator: warning: {problem}", file=sys.stderr)
            run = svc.ingest_view(view, name=args.name, labels=parse_labels(args.label), progress=prog)
        else:
            run = svc.ingest(args.path, name=args.name, labels=parse_labels(args.label), progress=prog)
    if args.json:
        _print_json(run.to_dict())
    else:
        print(f"ingested run {run.name!r} (id {run.id}): {run.n_tensors} tensors, {run.total_bytes} bytes")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    svc = _service(args)
    runs = svc.list_runs(labels=parse_labels(args.label), limit=args.limit, offset=args.offset)
    if args.json:
        _print_json({"runs": [r.to_dict() for r in runs]})
        return 0
    rows = [
        [str(r.id), r.name, r.created_at[:19], str(r.n_tensors), str(r.total_bytes),
         " ".join(f"{k}={v}" for k, v in sorted(r.labels.items()))]
        for r in runs
    ]
    if not rows:  # say which store was read: an empty listing from the wrong VALIDATOR_HOME looks the same
        db = svc.settings.database_url
        where = re.sub(r"://[^@/]*@", "://***@", db) if db else str(svc.settings.home)  # no password shown
        filters = " matching those labels" if args.label else ""
        print(f"no runs{filters} in the store at {where} (set VALIDATOR_HOME, --home or --db for another)")
        return 0
    print(format_rows(["id", "name", "created", "tensors", "bytes", "labels"], rows))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from validator.store.integrity import database_problems

    settings = Settings.from_env(home=args.home)
    # SQLite's own check first, before the store is opened (opening it migrates, which reads the schema)
    first = database_problems(replace(settings, database_url=args.db).db_url if args.db else settings.db_url)
    problems = first or []
    try:
        svc = _service(args)
    except Exception as exc:
        if not problems:  # a database that checks clean yet does not open: not damage; an error as before
            raise
        problems.append(f"database: could not open the store: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    else:
        problems += svc.check_store(deep=not args.quick, database=first is None)
    if args.json:
        _print_json({"ok": not problems, "problems": problems})
    else:
        print("\n".join(problems) if problems else "store ok: database and blobs agree")
    return 1 if problems else 0


def cmd_gc(args: argparse.Namespace) -> int:
    got = _service(args).collect(full=True, older_than_hours=args.older_than)
    if args.json:
        _print_json(got.to_dict())
    else:
        names = ", ".join(repr(n) for n in got.expired_runs)
        print(f"expired {len(got.expired_runs)} pending run(s){': ' + names if names else ''}; "
              f"deleted {got.blobs} blob(s), {got.bytes} bytes; removed {got.staging_files} staging file(s)")
        for name in got.foreign:
            print(f"left blobs/{name}: not a blob of this store (a foreign file or folder)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import DatabaseError

    from validator.store.crud import DamagedRowError

    try:
        doc = _service(args).show_run(args.run)
    except DatabaseError as exc:  # a damaged page (the database's, not a row's): say so, not an internal error
        raise DamagedRowError(f"the store's database could not be read: {str(exc.orig or exc).splitlines()[0][:300]}; "
                              "see `validator check`") from None
    if args.json:
        _print_json(doc)
        return 0
    print(f"run {doc['name']!r} (id {doc['id']}), created {doc['created_at'][:19]}, source {doc['source']}")
    for k, v in sorted(doc["labels"].items()):
        print(f"  {k}: {v}")
    print()
    rows = [
        [t["name"], " ".join(f"{k}={v}" for k, v in t["coords"].items()), t["kind"], str(t["shards"]), t["dtype"],
         "x".join(map(str, t["shape"])), "; ".join(t["notes"])]
        for t in doc["tensors"]
    ]
    print(format_rows(["tensor", "coords", "shards", "n", "dtype", "shape", "notes"], rows))
    return 0


def _policy_doc(path: str | None) -> dict[str, Any] | None:
    """The policy file's content (validated), to apply locally or send to a server."""
    if not path:
        return None
    from validator.judging.policy import Policy

    Policy.load(path)  # validate with a message naming the file
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)


def _comparison(args: argparse.Namespace, a: str, b: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(comparison document, pre-rendered extra tables), computed locally or by the server."""
    floor = tuple(args.floor) if args.floor else None
    policy = _policy_doc(args.policy)
    if args.server and args.executor not in (None, "local"):
        raise InputError("--executor is for local comparisons; a server measures where its VALIDATOR_COMPARE_EXECUTOR says")
    if args.server and getattr(args, "align_tokens", False):
        raise InputError("--align-tokens aligns local SGLang dumps; leave out --server")
    if args.server:
        client = _client(args)
        try:
            return client.compare(a, b, floor=floor, policy=policy), {}
        finally:
            client.close()
    from validator.judging.policy import Policy
    from validator.judging.report import comparison_doc
    from validator.service.comparing import compare_refs
    from validator.service.cycle_collector import cycle_collector_paused

    pol = Policy.from_dict(policy, source=args.policy) if policy is not None else None
    # the pairs' results and their document's dicts stay alive to the end: the cycle collector's walks over them
    # would cost more than the measuring of small pairs (benchmarks/many_pairs_bench.md)
    with cycle_collector_paused(), _progress("compare", not args.json) as prog:  # plain files: no store opened
        if getattr(args, "align_tokens", False):  # SGLang dumps batched differently (validator/runs/token_align.py)
            from validator.runs.token_align import align_views, open_for_alignment
            from validator.service.comparing import compare_resolved

            def resolve(r: str) -> Any:
                return open_for_alignment(r) if os.path.exists(r) else _service(args).resolve(r)

            pairs = [("A", "B", a, b)] + ([("FA", "FB", *floor)] if floor else [])
            views = {k: v for ka, kb, ra, rb in pairs for k, v in zip((ka, kb), align_views(resolve(ra), resolve(rb)))}
            c = compare_resolved(views.__getitem__, "A", "B", policy=pol, floor=("FA", "FB") if floor else None,
                                 progress=prog, executor=args.executor)
        else:
            c = compare_refs(a, b, open_store=lambda: _service(args), policy=pol, floor=floor, progress=prog, executor=args.executor)
        tables = {k: v["table"] for k, v in c.sections.items() if isinstance(v, dict) and v.get("table")}
        return comparison_doc(c), tables


def cmd_compare(args: argparse.Namespace) -> int:
    from validator.judging.report import dumps, format_comparison, write_junit

    doc, tables = _comparison(args, args.a, args.b)
    if args.junit:
        write_junit(doc, args.junit)
    print(dumps(doc, indent=True) if args.json else format_comparison(doc, tables=tables))
    return VERDICT_EXIT[doc["verdict"]]


def cmd_gate(args: argparse.Namespace) -> int:
    """Like compare, for CI: prints Markdown, appends it to $GITHUB_STEP_SUMMARY, optional JUnit."""
    from validator.judging.report import dumps, markdown_summary, write_junit

    doc, _ = _comparison(args, args.baseline, args.candidate)
    link = f"{args.server.rstrip('/')}/comparisons/{doc['comparison_id']}" if args.server and "comparison_id" in doc else None
    md = markdown_summary(doc, link=link)
    if args.junit:
        write_junit(doc, args.junit)
    summary = ClientSettings.from_env().step_summary
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(md + "\n")
    print(dumps(doc, indent=True) if args.json else md)
    return VERDICT_EXIT[doc["verdict"]]


def cmd_push(args: argparse.Namespace) -> int:
    if not args.server:
        raise InputError("push needs --server URL (to store locally, use `validator ingest`)")
    client = _client(args)
    try:
        run = client.push(args.bundle, name=args.name, labels=parse_labels(args.label))
    finally:
        client.close()
    print(json.dumps(run, indent=1) if args.json else f"pushed run {run['name']!r} (id {run['id']}): {run['n_tensors']} tensors")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from validator.app.server import serve

    settings = Settings.from_env(home=args.home)
    if args.db:
        settings = replace(settings, database_url=args.db)
    if args.token:
        settings = replace(settings, tokens=settings.tokens + tuple(args.token))
    return serve(settings, host=args.host, port=args.port, allow_open=args.insecure_no_token)


def cmd_warm(args: argparse.Namespace) -> int:
    from validator.numerics.numba_cache import portable_target
    from validator.numerics.warm import warm_up

    cpu = portable_target() or "this host's CPU"  # (before numba is imported: warm_up imports it)
    print(f"compiling the CPU comparison engine for each float format (numba, for {cpu}; each line when done):", file=sys.stderr, flush=True)
    seconds = warm_up(lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    print(f"the CPU engine is compiled for every float format ({seconds:.1f} s; numba's on-disk cache keeps it)")
    return 0


def _client(args: argparse.Namespace) -> Any:
    from validator.app.client import Client

    return Client(args.server, args.token_value or ClientSettings.from_env().token)


def cmd_probe_gsm8k(args: argparse.Namespace) -> int:
    from validator.workloads.gsm8k import run_from_args

    svc = _service(args)
    return run_from_args(args, ingest=lambda path: svc.ingest(path))


def cmd_pd_layout(args: argparse.Namespace) -> int:
    """Head-aware draft-KV transfer plan for one decode rank, or a check of a given plan (validator/workloads/kv_transfer_plan.py)."""
    from validator.workloads import kv_transfer_plan as pdl

    def load(path: str) -> Any:
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None

    def ints(text: str | None) -> list[int] | None:
        return None if text is None else [int(x) for x in text.split(",") if x.strip()]

    p, d = pdl.KVLayout.from_dict(load(args.prefill)), pdl.KVLayout.from_dict(load(args.decode))
    pages: Any = ints(args.pages) if args.pages and "," in args.pages else (int(args.pages) if args.pages else None)
    kw: dict[str, Any] = {"src_pages": ints(args.src_pages), "dst_pages": ints(args.dst_pages)}
    if args.pd_command == "plan":
        runs = pdl.transfer_plan(p, d, args.dst_rank, pages=1 if pages is None else pages, **kw)
        rows = [r.to_dict() for r in runs]
        if args.json:
            _print_json(rows)
        else:
            for r in rows:
                print(" ".join(f"{k}={v}" for k, v in r.items()))
        return 0
    check = pdl.check_plan(p, d, args.dst_rank, pdl.parse_plan(load(args.plan)), pages=pages, **kw)
    if args.json:
        _print_json(check.to_dict())
    else:
        print("\n".join(check.lines()))
    return 0 if check.ok else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from validator.workloads.demo import run_demo

    return run_demo(_service(args), out=args.out, json_out=args.json)


def _judging_options(s: argparse.ArgumentParser, *, json_help: str) -> None:
    """The options `compare` and `gate` share."""
    s.add_argument("--policy", help="TOML policy file (per-name-glob thresholds); see docs/policy.md")
    s.add_argument("--floor", nargs=2, metavar=("RUN_A", "RUN_B"), help="noise-floor pair: thresholds as multiples of it")
    s.add_argument("--json", action="store_true", help=json_help)
    s.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    s.add_argument("--align-tokens", action="store_true", help="SGLang dumper runs batched differently: pair the "
                   "tensors token by token, by the requests' input ids and positions (docs/sglang.md, section 4)")
    s.add_argument(
        "--executor",
        metavar="WHERE",
        help="where to measure the pairs: local (this process, the default), ray or ray=ADDRESS: the Ray cluster at "
        "ADDRESS (HOST:PORT of its head; default $RAY_ADDRESS or this machine's), whose workers read the tensors "
        "from the blob store or a shared filesystem (docs/ray.md)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="validator",
        description="Numerical-equivalence and acceptance validation for LLM inference.",
        epilog="Exit codes: 0 pass, 1 fail, 2 bad input or usage, 3 inconclusive.",
    )
    p.add_argument("--home", help="store directory (default: $VALIDATOR_HOME or ~/.validator)")
    p.add_argument("--db", help="SQLAlchemy database URL (default: SQLite in the home; $VALIDATOR_DATABASE_URL)")
    p.add_argument("--server", default=ClientSettings.from_env().server, help="work against a validator server (URL)")
    p.add_argument("--token", dest="token_value", help="bearer token for --server (default: $VALIDATOR_TOKEN)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("ingest", help="store a bundle, a .safetensors file or a directory of them as one run")
    s.add_argument("path")
    s.add_argument("--name", help="run name (default: the bundle's run name or the file/directory name)")
    s.add_argument("--label", action="append", metavar="KEY=VALUE", help="add a label (repeatable)")
    s.add_argument("--json", action="store_true", help="print the stored run as JSON")
    s.add_argument(
        "--format",
        choices=["auto", "sglang-dumper"],
        default="auto",
        help="'sglang-dumper': a folder written by SGLang's dumper (auto-detected when unambiguous); docs/sglang.md",
    )
    s.add_argument(
        "--split",
        action="append",
        metavar="NAME_GLOB=DIM",
        help="sglang-dumper: tensors matching the glob are TP slices along DIM, in rank order (default: copies)",
    )
    s.add_argument("--max-file-bytes", type=int, default=4 << 30, help="sglang-dumper: refuse larger .pt files")
    s.set_defaults(func=cmd_ingest)

    s = sub.add_parser("runs", help="list stored runs")
    s.add_argument("--label", action="append", metavar="KEY=VALUE", help="only runs with this label (repeatable)")
    s.add_argument("--limit", type=int, default=100)
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_runs)

    s = sub.add_parser(
        "check",
        help="check the store: database integrity, every blob present with its size and hash, no orphans, "
        "no leftovers of dead processes; exit 0 ok, 1 problems (listed)",
    )
    s.add_argument("--quick", action="store_true", help="do not hash local blobs (sizes only)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser(
        "gc",
        help="collect garbage: expire pending runs abandoned for longer than VALIDATOR_PENDING_EXPIRY_HOURS "
        "(default 168) and delete every blob nothing references, and staging leftovers; safe beside a running server",
    )
    s.add_argument("--older-than", type=float, metavar="HOURS", help="expiry age for this collection (default: the setting)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_gc)

    s = sub.add_parser("show", help="show one stored run: manifest, labels and tensor inventory")
    s.add_argument("run", help="run name or id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_show)

    s = sub.add_parser(
        "compare",
        help="compare run B against reference run A",
        description="A and B may each be a stored run (name or id), a bundle directory, a .safetensors file "
        "or a directory of them. Exit codes: 0 pass, 1 fail, 2 bad input, 3 inconclusive. A failing verdict "
        "names the first divergence first (the first failing pair in data-flow order: step, then capture "
        "order), the problem nodes and what fails downstream of them, then the worst pairs; with acceptance "
        "records, where acceptance and greedy output first part (docs/policy.md).",
    )
    s.add_argument("a", help="reference run")
    s.add_argument("b", help="candidate run")
    _judging_options(s, json_help="print one JSON document")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser(
        "gate",
        help="CI gate: compare, print a Markdown summary (also to $GITHUB_STEP_SUMMARY), exit 0/1/2/3",
        description="Like compare; the Markdown summary and the JUnit file lead with the first divergence "
        "and the problem nodes (docs/policy.md).",
    )
    s.add_argument("baseline", help="reference run")
    s.add_argument("candidate", help="candidate run")
    _judging_options(s, json_help="print the comparison JSON instead of Markdown")
    s.set_defaults(func=cmd_gate)

    s = sub.add_parser("push", help="upload a bundle to a server (--server URL) as one run")
    s.add_argument("bundle")
    s.add_argument("--name", help="run name (default: the bundle's)")
    s.add_argument("--label", action="append", metavar="KEY=VALUE")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_push)

    s = sub.add_parser("serve", help="serve the JSON API (and dashboard) over the store")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--token", action="append", help="accept this bearer token (repeatable; also $VALIDATOR_TOKENS)")
    s.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow serving on a non-loopback address without any token (anyone can write)",
    )
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser(
        "warm", help="compile the CPU comparison engine for every float format now, not at its first comparison"
    )
    s.set_defaults(func=cmd_warm)

    s = sub.add_parser("demo", help="run the projection probe on CPU at reduced shapes, store and compare the paths")
    s.add_argument("--out", help="where to write the bundles (default: a temporary directory)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("pd-layout", help="PD draft-KV transfer: the head-aware plan, or check a plan against it")
    pd_sub = s.add_subparsers(dest="pd_command", metavar="ACTION")
    pd_sub.required = True
    for action, help_text in (("plan", "print the runs one decode rank must receive"),
                              ("check", "check a plan (JSON list of {layer, page, src_addr, dst_addr, length}); exit 1 if wrong")):
        s = pd_sub.add_parser(action, help=help_text, description="Layouts are JSON: tp_size, total_kv_heads, head_dim, dtype, "
                              "page_size, layers, page_layout (NHD/HND), buffers {rank: {k: [...], v: [...]}}. See docs/sglang.md.")
        s.add_argument("--prefill", required=True, metavar="LAYOUT.json", help="prefill (source) layout")
        s.add_argument("--decode", required=True, metavar="LAYOUT.json", help="decode (destination) layout")
        s.add_argument("--dst-rank", type=int, required=True, help="decode rank whose transfer is planned/checked")
        if action == "check":
            s.add_argument("--plan", required=True, metavar="PLAN.json")
        s.add_argument("--pages", help="page count or comma-separated page indices (check: plus every page the plan names)")
        s.add_argument("--src-pages", help="the request's page ids on P, comma-separated (default: page index)")
        s.add_argument("--dst-pages", help="the request's page ids on D, comma-separated (default: page index)")
        s.add_argument("--json", action="store_true")
        s.set_defaults(func=cmd_pd_layout)

    from validator.app.cli_rl import add_commands as _rl_commands

    _rl_commands(sub)  # rl kl, manifest write / diff (docs/rl.md)

    from validator.app.cli_policy import add_commands as _policy_commands

    _policy_commands(sub)  # policy import-sglang (docs/sglang.md)

    probe = sub.add_parser("probe", help="run a probe").add_subparsers(
        dest="probe", metavar="PROBE", parser_class=_DeferredParser
    )
    probe.required = True
    s = probe.add_parser("metrics", help="acceptance counters from an SGLang/vLLM Prometheus endpoint over a window")
    from validator.workloads.scrape import add_arguments as _metrics_args
    from validator.workloads.scrape import run_from_args as _metrics_run

    _metrics_args(s)
    s.set_defaults(func=lambda a: _metrics_run(a, ingest=lambda path: _service(a).ingest(path, name=a.name)))
    s = probe.add_parser(
        "gsm8k",
        help="GSM8K accuracy + acceptance against a live SGLang/OpenAI-compatible server; stored as a run",
    )
    from validator.workloads.gsm8k import add_arguments as gsm8k_arguments

    gsm8k_arguments(s)
    s.set_defaults(func=cmd_probe_gsm8k)
    probe.add_parser(
        "projection",
        help="DFlash context projection: concat vs PP-partial vs FP64 reference",
        define=_projection_options,  # validator.workloads.projection_report imports torch: only when this command is used
    )
    probe.add_parser(
        "transformers",
        help="a Hugging Face transformers model and draft run D-only, PD or broken PD, captured (docs/transformers.md)",
        define=_transformers_options,
    )
    return p


def _projection_options(s: argparse.ArgumentParser) -> None:
    try:
        from validator.workloads.projection_report import add_arguments, run_from_args

        add_arguments(s)
        s.set_defaults(func=lambda a: run_from_args(a))
    except ImportError as exc:  # pragma: no cover - only while the module is missing
        err = f"validator: error: the projection probe is unavailable ({exc})"
        s.set_defaults(func=lambda a: print(err, file=sys.stderr) or 2)


def _transformers_options(s: argparse.ArgumentParser) -> None:
    from validator.workloads.transformers_pd import add_arguments, run_from_args

    add_arguments(s)
    s.set_defaults(func=run_from_args)


class _DeferredParser(argparse.ArgumentParser):
    """A subcommand parser whose options are defined by ``define(parser)`` the first time it parses or formats
    its help. Options that come from a module importing torch then cost nothing to the other commands (an
    ingest never imports torch; see docs/performance.md)."""

    def __init__(self, *args: Any, define: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._define = define

    def _defined(self) -> None:
        define, self._define = self._define, None
        if define is not None:
            define(self)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:  # type: ignore[override]
        self._defined()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._defined()
        return super().format_usage()

    def format_help(self) -> str:
        self._defined()
        return super().format_help()


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors of the probes package that are the user's to fix (exit 2). ``ProjectionConfigError`` lives in a
    module that imports torch; it can only have been raised if that module was loaded."""
    errors: tuple[type[Exception], ...] = (BundleError, ShardSpecError, ProbeConfigError)
    projection = sys.modules.get("probes.workloads.projection_config")
    return errors if projection is None else (*errors, projection.ProjectionConfigError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ValidatorError as exc:
        print(f"validator: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except _user_errors() as exc:
        print(f"validator: error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"validator: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print("validator: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a bare traceback for a user; VALIDATOR_DEBUG=1 shows it
        if ClientSettings.from_env().debug:
            raise
        print(f"validator: internal error: {type(exc).__name__}: {exc} (set VALIDATOR_DEBUG=1 for details)", file=sys.stderr)
        return 4
    finally:
        # deterministically, not when a traceback's reference cycle is collected: a failed command leaves
        # nothing behind (tests/reliability/test_security.py checks the tree)
        _close_services()


def entry() -> NoReturn:
    """The ``validator`` command and ``python -m validator``: :func:`main`, then the exit. ``gc.freeze()`` keeps the
    interpreter's last garbage collections off the millions of objects torch and numba leave behind: 0.55 s of a
    3 s ``validator compare`` of two files on the 2-core box (``benchmarks/file_compare_bench.md``). The process
    is ending and ``main`` has closed what it opened (its ``finally``). What changes at exit: objects in a reference
    cycle, or reachable only through one, are no longer freed or finalized (``__del__``, ``weakref.ref`` callbacks);
    objects freed by reference counting still are, and ``atexit`` handlers, ``weakref.finalize`` among them, still
    run. Nothing here needs the former: the store, clients and temporary directories are closed explicitly."""
    code = main()
    gc.freeze()
    if "triton" in sys.modules:  # (torch._dynamo imports it) its nanobind bindings would report every object left
        _exit_now(code)  # to the frozen generation as "leaked" at teardown: ~30 lines after the last message
    sys.exit(code)


def _exit_now(code: int) -> NoReturn:
    """Exit as ``sys.exit`` does (``atexit`` handlers, streams flushed) without the interpreter's teardown."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
