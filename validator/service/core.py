"""The one service layer: every use case the CLI, the API and the dashboard offer goes through here (uploads
and finalize in :mod:`.uploads`, the expiry of pending runs and gc in :mod:`.expiry`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError

from probes.core.shards import Coords, ShardSpec
from validator.errors import ConflictError, InputError, NotFoundError, StorageError
from validator.runs.reassembly import group_logical
from validator.runs.sources import open_path
from validator.runs.tensorfile import check_dtype, file_byte_chunks, torch_dtype
from validator.runs.view import RunView, TensorRef
from validator.service.access import StoreAccess
from validator.service.comparing import Progress, compare_resolved
from validator.service.cycle_collector import cycle_collector_paused
from validator.service.expiry import Collected, collect
from validator.settings import Settings, parse_executor
from validator.store import crud as store
from validator.store.blobs import Durability, remove_stale_temp, temp_prefix
from validator.store.models import ComparisonRecord, Run

if TYPE_CHECKING:  # comparing imports torch (via .metrics); ingesting must not (docs/architecture.md)
    import torch

    from validator.judging.compare import Comparison
    from validator.judging.policy import Policy
    from validator.judging.rl_kl import KLReport, KLSettings

__all__ = ["Service", "RunSummary", "Progress"]

BACKGROUND_BYTES = 256 << 20  # comparisons of more input bytes than this run in the background


def _comparison_dict(rec: ComparisonRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "status": rec.status,
        "verdict": rec.verdict,
        "request": rec.request,
        "error": rec.error,
        "result": rec.result,
    }


@dataclass(frozen=True)
class RunSummary:
    id: int
    name: str
    created_at: str
    labels: dict[str, str]
    n_tensors: int
    total_bytes: int
    source: str

    @classmethod
    def of(cls, run: Run) -> RunSummary:
        return cls(
            id=run.id,
            name=run.name,
            created_at=run.created_at.isoformat() if run.created_at else "",
            labels=run.label_dict(),
            n_tensors=run.n_tensors,
            total_bytes=run.total_bytes,
            source=run.source,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Service(StoreAccess):
    """Built once per process from :class:`Settings`; holds the engine and the blob store (:class:`StoreAccess`)
    and the background comparisons' threads."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="compare")
        # comparisons this process is computing: record id -> set once the result (or error) is recorded.
        # Identical requests arriving meanwhile wait on it instead of answering the unfinished record.
        self._computing: dict[int, threading.Event] = {}
        self._computing_lock = threading.Lock()
        parse_executor(settings.compare_executor)  # a bad VALIDATOR_COMPARE_EXECUTOR fails at start

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.dispose()

    def recover(self) -> dict[str, int]:
        """Tidy up after a crash; a server calls this once at startup (see docs/reliability.md).

        Comparisons a dead server left 'queued' or 'running' become 'error' (asking again recomputes
        them) instead of being polled forever; temporary files of dead processes (finalize directories,
        blob spool files) are removed. Partial uploads are kept for resuming, unless untouched for the pending
        runs' expiry age; pending runs past it are collected (:meth:`collect`). Runs need nothing else: one
        becomes visible only in the transaction that completes it.
        """
        with self.session() as s, s.begin():
            n = store.interrupt_comparisons(
                s, error="interrupted: the server stopped while computing this comparison; request it again"
            )
        stale = 0
        staging = self.settings.staging_dir
        stale += len(remove_stale_temp(staging, kinds=("tmp", "finalize")))
        spools = (getattr(self.blobs, "tmp", None), getattr(getattr(self.blobs, "cache", None), "tmp", None))
        for d in {Path(x) for x in spools if x is not None}:  # local store's and S3 cache's spool files
            stale += len(remove_stale_temp(d, kinds=("tmp",)))
        expired = self.collect()  # pending runs abandoned for longer than the expiry age
        cutoff = time.time() - 3600 * self.settings.pending_expiry_hours
        for p in staging.glob("*.partial") if staging.is_dir() else ():
            if p.stat().st_mtime < cutoff:
                p.unlink(missing_ok=True)
                stale += 1
        return {"comparisons": n, "temp_files": stale + expired.staging_files, "expired_runs": len(expired.expired_runs)}

    def collect(self, *, full: bool = False, older_than_hours: float | None = None) -> Collected:
        """Expire abandoned pending runs and delete the blobs only they held; ``full``: every unreferenced blob
        and staging leftover too (validator.service.expiry; docs/reliability.md)."""
        return collect(self, full=full, older_than_hours=older_than_hours)

    def check_store(self, *, deep: bool = True, database: bool = True) -> list[str]:
        """Problems in the store (validator.store.integrity); empty when database and blobs agree. A damaged
        database is reported (what could not be read), never raised. ``database``: run the database's own
        check (False when :func:`validator.store.integrity.database_problems` already ran it)."""
        from validator.store.integrity import check_store, database_problems

        problems: list[str] = []
        if database:
            got = database_problems(self.settings.db_url)  # SQLite: its own check first, on a connection of its own
            problems += got or []
            database = got is None
        with self.session() as s:
            problems += check_store(s, self.blobs, staging_dir=self.settings.staging_dir, deep=deep, database=database)
        home = str(self.settings.home) + os.sep  # paths relative to the store's home, as the API shows them
        return [p.replace(home, "") for p in problems]

    # -- ingest ---------------------------------------------------------------------------------
    def ingest(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        progress: Progress | None = None,
    ) -> RunSummary:
        """Store a bundle / safetensors file / directory as one run, atomically.

        Everything is validated first (headers, records, shard layouts); tensor bytes are copied into the
        blob store with their sha256 checked against the records; the run and its records become visible
        in one transaction. On any failure, blobs this ingest created and nothing references are removed.
        """
        with cycle_collector_paused():
            view = open_path(path)
            return self.ingest_view(view, name=name, labels=labels, progress=progress)

    def ingest_view(
        self,
        view: RunView,
        *,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        progress: Progress | None = None,
        pending: int | None = None,
    ) -> RunSummary:
        """Store a run view. ``pending``: id of a pending run (uploaded over the API) to complete."""
        run_name = store.check_run_name(name or view.name)
        group_logical(view.tensors)  # refuse impossible shard layouts before storing anything
        store.check_labels({**view.labels, **(labels or {})}, where=view.location)  # and what the columns can't hold
        for ref in view.tensors:
            store.check_tensor_record(name=ref.name, coords=ref.coords.to_dict(), shard=ref.shard.to_dict(), where=f"{ref.origin}: ")
        if pending is None:
            with self.session() as s:
                if store.get_run(s, ref=run_name, include_pending=True) is not None:
                    raise InputError(f"a run named {run_name!r} already exists; choose another with --name")
        created: list[str] = []
        try:
            records, blobs = [], {}
            sources: dict[str, Callable[[], Iterable[bytes | memoryview]]] = {}
            with Durability() as batch:  # one run's blobs made durable together, before the records that point at them
                for i, ref in enumerate(view.tensors):
                    sha, size = self._store_tensor(ref, created, batch)
                    blobs[sha] = size
                    sources[sha] = ref.byte_chunks
                    records.append(
                        {
                            "name": ref.name,
                            "coords": ref.coords.to_dict(),
                            "shard": ref.shard.to_dict(),
                            "dtype": ref.dtype,
                            "shape": list(ref.shape),
                            "sha256": sha,
                            "nbytes": size,
                        }
                    )
                    if progress:
                        progress(i + 1, len(view.tensors))
                artifacts = self._store_artifacts(view, created, blobs, sources)
                batch.flush()
            all_labels = {**view.labels, **(labels or {})}
            with self.session() as s, s.begin():
                store.blob_gc_lock(s, exclusive=False)
                self._restore_missing(sources)  # under the lock: no collection can delete them before the commit
                store.add_blobs(s, blobs=blobs)
                manifest = {**view.manifest, "ingested_from": view.location}
                if pending is None:
                    run = store.create_run(s, name=run_name, source=view.source, manifest=manifest, labels=all_labels)
                else:
                    got_pending = s.get(Run, pending, with_for_update=True)
                    if got_pending is None or got_pending.status != "pending" or got_pending.name != run_name:
                        raise ConflictError(f"run {run_name!r} is no longer pending (finalized, or expired unfinished)")
                    run = got_pending
                store.complete_run(s, run=run, tensors=records, artifacts=artifacts, manifest=manifest, labels=all_labels)
            with self.session() as s:
                got = store.get_run(s, ref=str(run.id))
                assert got is not None
                return RunSummary.of(got)
        except BaseException:
            self.discard_blobs(created)
            raise

    def _store_tensor(self, ref: TensorRef, created: list[str], batch: Durability) -> tuple[str, int]:
        """Copy one tensor's bytes into the blob store, streamed (bounded memory), sha256 checked."""
        try:
            sha, size, new = self.blobs.put(ref.byte_chunks(), expect_sha256=ref.sha256, batch=batch)
        except (InputError, StorageError) as exc:
            raise type(exc)(f"{ref.origin}: tensor {ref.name!r}: {exc}") from None
        except OSError as exc:  # reading the source file
            raise InputError(f"{ref.origin}: tensor {ref.name!r}: {exc.strerror or exc}") from None
        if new:
            created.append(sha)
        return sha, size

    def _store_artifacts(
        self,
        view: RunView,
        created: list[str],
        blobs: dict[str, int],
        sources: dict[str, Callable[[], Iterable[bytes | memoryview]]],
    ) -> list[dict[str, Any]]:
        """Acceptance records (validated, then stored columnar as one Parquet blob); GSM8K rows and
        engine counters as the files they are."""
        out = []

        def put_bytes(data: Callable[[], Iterable[bytes | memoryview]], kind: str) -> None:
            sha, size, new = self.blobs.put(data())
            if new:
                created.append(sha)
            blobs[sha] = size
            sources[sha] = data
            out.append({"kind": kind, "sha256": sha, "nbytes": size})

        def put_file(path: Path, kind: str) -> None:
            put_bytes(functools.partial(file_byte_chunks, path, 0, path.stat().st_size), kind)

        if view.gsm8k_file is not None:
            from validator.runs.workload_files import load_gsm8k_rows

            load_gsm8k_rows(view.gsm8k_file)  # validate before storing
            put_file(view.gsm8k_file, "gsm8k")
        if view.engine_metrics_file is not None:
            from validator.runs.workload_files import load_metrics_doc

            load_metrics_doc(view.engine_metrics_file)
            put_file(view.engine_metrics_file, "engine-metrics")
        if view.has_logprobs:  # RL logprob records (docs/rl.md), validated, then stored as Parquet
            from validator.runs.logprob_records import write_logprob_parquet

            records = view.load_logprobs()
            self.settings.staging_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=temp_prefix(), dir=self.settings.staging_dir) as tmp:
                lp_path = Path(tmp) / "logprobs.parquet"
                write_logprob_parquet(records, lp_path)
                lp_data = lp_path.read_bytes()
            put_bytes(lambda: [lp_data], "logprobs")
        if not view.has_acceptance:
            return out
        from validator.runs.acceptance_records import write_acceptance_parquet  # pandas/pyarrow only when needed

        df = view.load_acceptance()
        self.settings.staging_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=temp_prefix(), dir=self.settings.staging_dir) as tmp:
            path = Path(tmp) / "acceptance.parquet"
            write_acceptance_parquet(df, path)
            data = path.read_bytes()  # columnar and compressed: small next to the records it holds
        put_bytes(lambda: [data], "acceptance")
        return out

    def _restore_missing(self, sources: dict[str, Callable[[], Iterable[bytes | memoryview]]]) -> None:
        """Inside the transaction that references them, holding the blob-GC lock shared: a blob this ingest
        wrote or found may have been deleted since (by a concurrent failed ingest, or a collection of blobs
        nothing referenced yet, validator.service.expiry); write it again from our own copy. No collection can
        delete it between this check and the commit."""
        for sha, source in sources.items():
            if not self.blobs.exists(sha):
                self.blobs.put(source(), expect_sha256=sha)

    # -- queries --------------------------------------------------------------------------------
    def list_runs(self, *, labels: dict[str, str] | None = None, limit: int = 100, offset: int = 0) -> list[RunSummary]:
        with self.session() as s:
            return [RunSummary.of(r) for r in store.list_runs(s, labels=labels, limit=limit, offset=offset)]

    def count_runs(self, *, labels: dict[str, str] | None = None) -> int:
        with self.session() as s:
            return store.count_runs(s, labels=labels)

    def get_run(self, ref: str) -> Run:
        with self.session() as s:
            run = store.get_run(s, ref=ref)
            if run is None:
                raise NotFoundError(f"no run named {ref!r} in the store")
            return run

    def show_run(self, ref: str) -> dict[str, Any]:
        run = self.get_run(ref)
        view = self.stored_view(run)
        logical = group_logical(view.tensors)
        return {
            **RunSummary.of(run).to_dict(),
            "manifest": run.manifest,
            "artifacts": [{"kind": a.kind, "nbytes": a.nbytes, "sha256": a.sha256} for a in run.artifacts],
            "tensors": [
                {
                    "name": lt.name,
                    "coords": lt.coords.to_dict(),
                    "kind": lt.kind,
                    "shards": len(lt.shards),
                    "dtype": lt.dtype,
                    "shape": list(lt.shape()),
                    "notes": lt.notes,
                }
                for lt in sorted(logical.values(), key=lambda x: (x.name, x.coords.label()))
            ],
        }

    def acceptance_summary(self, ref: str) -> dict[str, Any] | None:
        """Per-run acceptance summary (rates per position, histogram, engine-style metrics), or None."""
        view = self.stored_view(self.get_run(ref))
        if not view.has_acceptance:
            return None
        from validator.judging.acceptance import StepArrays, summarize_run

        s = summarize_run(StepArrays.from_frame(view.load_acceptance()))
        return {**s.to_dict(), "engine_metrics": s.engine_metrics()}

    def stored_view(self, run: Run) -> RunView:
        with self.session() as s:
            rows = store.run_tensors(s, run_id=run.id)
        refs = []
        run_name, open_blob, read_blob = run.name, self._open_blob, self.blobs.read_into  # once, not per record
        known: set[str] = set()  # the dtypes checked (a run has a few)
        for name, slot, dtype, shape_text, sha256, nbytes in rows:  # the columns of run_tensors, in order
            try:
                shape = _shape(shape_text)
                coords, shard = _placement(slot)
            except Exception as exc:
                column = "shape" if not _readable(_shape, shape_text) else "slot (coordinates and shard spec)"
                raise store.DamagedRowError(
                    f"run {run_name!r} tensor {name!r}: its stored {column} is damaged ({type(exc).__name__}: {exc}); "
                    "see `validator check`"
                ) from None
            if dtype not in known:
                check_dtype(dtype, where=f"run {run_name!r} tensor {name!r}: ")
                known.add(dtype)
            refs.append(
                TensorRef(
                    name=name,
                    coords=coords,
                    shard=shard,
                    dtype=dtype,
                    shape=shape,
                    sha256=sha256,
                    nbytes=nbytes,
                    origin=f"run {run_name!r} blob {sha256[:12]}",
                    loader=functools.partial(open_blob, sha256, dtype, shape, nbytes),
                    read_into=functools.partial(read_blob, sha256),
                )
            )
        acc = next((a for a in run.artifacts if a.kind == "acceptance"), None)
        gsm = next((a for a in run.artifacts if a.kind == "gsm8k"), None)
        eng = next((a for a in run.artifacts if a.kind == "engine-metrics"), None)
        lp = next((a for a in run.artifacts if a.kind == "logprobs"), None)
        return RunView(
            name=run.name,
            source="store",
            location=f"store:{run.id}",
            labels=run.label_dict(),
            manifest=run.manifest,
            tensors=refs,
            acceptance_parquet=self.blobs.path(acc.sha256) if acc else None,
            gsm8k_file=self.blobs.path(gsm.sha256) if gsm else None,
            engine_metrics_file=self.blobs.path(eng.sha256) if eng else None,
            logprob_parquet=self.blobs.path(lp.sha256) if lp else None,
            run_id=run.id,
        )

    def _open_blob(self, sha256: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> torch.Tensor:
        """A stored tensor. Torch is imported here, when bytes are read: listing or showing runs never loads it."""
        return self.blobs.open_tensor(sha256, torch_dtype(dtype), shape, nbytes)

    def resolve(self, ref: str, *, allow_paths: bool = True) -> RunView:
        """A run named in the store, or (locally only) a path: bundle, safetensors file or directory."""
        p = Path(ref)
        if allow_paths and p.exists():
            return open_path(p)
        with self.session() as s:
            run = store.get_run(s, ref=ref)
        if run is None:
            raise NotFoundError(f"{ref!r} is neither a stored run nor an existing path")
        return self.stored_view(run)

    def rl_kl(self, ref: str, settings: KLSettings | None = None) -> KLReport:
        """The train/rollout KL report (validator.judging.rl_kl.KLReport) of a stored run's logprob records."""
        from validator.judging.rl_kl import kl_report

        view = self.resolve(ref, allow_paths=False)
        if not view.has_logprobs:
            raise NotFoundError(f"run {ref!r} has no logprob records (a bundle part's logprobs.jsonl; docs/rl.md)")
        return kl_report(view.load_logprobs(), settings)

    # -- compare --------------------------------------------------------------------------------
    def compare(
        self,
        a: str,
        b: str,
        *,
        policy: Policy | None = None,
        floor: tuple[str, str] | None = None,
        progress: Progress | None = None,
        allow_paths: bool = True,
        executor: str | None = None,
    ) -> Comparison:
        """``executor``: ``local`` (default), ``ray`` or ``ray=ADDRESS``: where the pairs are measured
        (validator.executors; the workers read stored runs from this store's blobs)."""
        resolve = functools.partial(self.resolve, allow_paths=allow_paths)
        blob_url = self.settings.blob_url or f"file://{self.settings.blob_dir.resolve()}"
        # thousands of records, tensor references and pair results stay alive until the end: the cycle
        # collector's full passes over them cost more than the measuring of small pairs (many_pairs_bench.md)
        with cycle_collector_paused():
            return compare_resolved(resolve, a, b, policy=policy, floor=floor, progress=progress, executor=executor,
                                    blob_url=blob_url)

    def cached_comparison(
        self,
        a: str,
        b: str,
        *,
        floor: tuple[str, str] | None = None,
        policy: dict[str, Any] | None = None,
        background: bool | None = None,
    ) -> dict[str, Any]:
        """A comparison of stored runs, computed once per (a, b, floor, policy) and cached.

        Stored runs are immutable, so the cache never goes stale. Large comparisons run in the background
        (``background=None`` decides by size); the record's ``status`` says queued/running/done/error.
        Identical requests at once compute it once: a foreground one that finds it being computed by another
        request of this process waits for that result (docs/reliability.md).
        """
        from validator.judging.policy import JUDGING_VERSION, Policy

        pol = Policy.from_dict(policy or {}, source="request") if policy else None
        runs = [self.get_run(r) for r in (a, b, *(floor or ()))]
        request = {"a": runs[0].name, "b": runs[1].name, "floor": [r.name for r in runs[2:]] or None, "policy": policy or {}}
        # the judging rules' version is part of the key: a stored comparison is reused only while the
        # rules that judged it are the current ones
        key_doc = {**request, "judging": JUDGING_VERSION}
        key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
        size = sum(r.total_bytes for r in runs)
        run_bg = background if background is not None else size > BACKGROUND_BYTES
        rec_id, done = self._claim_comparison(key, request)
        if done is None and not run_bg:
            done = self._await_comparison(rec_id)  # computed by another request: wait for it (or compute it here)
        if done is not None:
            job = functools.partial(
                self._run_comparison, rec_id, request, pol, self.settings.compare_executor if run_bg else None, done
            )
            if not run_bg:
                job()
            else:
                try:
                    self._executor.submit(job)
                except BaseException:  # not queued (the service is closing): release the waiters
                    self._finish_computing(rec_id, done)
                    raise
        return self.get_comparison(rec_id)

    def _claim_comparison(self, key: str, request: dict[str, Any]) -> tuple[int, threading.Event | None]:
        """The cached record of ``key`` (created queued when new), and an event when this call is to compute it:
        a new record, or one that ended in error. The event is registered before the record is committed, so
        a request that sees the record queued finds it (see :meth:`_await_comparison`)."""
        done: threading.Event | None = None
        rec_id = -1
        try:
            with self.session() as s, s.begin():
                rec = store.get_comparison(s, key=key)
                if rec is None:
                    try:
                        with s.begin_nested():
                            rec = store.save_comparison(s, key=key, request=request)
                    except IntegrityError:  # a concurrent request created it first: it computes it
                        rec = store.get_comparison(s, key=key)
                        assert rec is not None
                        return rec.id, None
                elif rec.status != "error":
                    return rec.id, None
                rec_id = rec.id
                done = self._start_computing(rec_id)
                if done is not None:
                    rec.status, rec.error = "queued", None
                return rec_id, done
        except BaseException:
            if done is not None:
                self._finish_computing(rec_id, done)
            raise

    def _start_computing(self, rec_id: int) -> threading.Event | None:
        with self._computing_lock:
            if rec_id in self._computing:
                return None  # another request of this process computes it
            done = self._computing[rec_id] = threading.Event()
            return done

    def _finish_computing(self, rec_id: int, done: threading.Event) -> None:
        with self._computing_lock:
            if self._computing.get(rec_id) is done:
                del self._computing[rec_id]
        done.set()

    def _await_comparison(self, rec_id: int) -> threading.Event | None:
        """Wait until another request's computation of this record is recorded. Returns an event when this
        call is to compute it itself instead: the record is queued or running but no request of this process
        computes it (another process does, or one that died): the result is the same whoever computes it."""
        with self._computing_lock:
            running = self._computing.get(rec_id)
        if running is not None:
            running.wait()
            return None
        if self.get_comparison(rec_id)["status"] in ("done", "error"):
            return None
        done = self._start_computing(rec_id)
        if done is None:  # started here in the meantime
            return self._await_comparison(rec_id)
        return done

    def _run_comparison(
        self,
        rec_id: int,
        request: dict[str, Any],
        policy: Policy | None,
        executor: str | None = None,
        done: threading.Event | None = None,
    ) -> None:
        """Compute and record one comparison; ``done`` (from :meth:`_claim_comparison`) is set once recorded."""
        try:
            self._compute_comparison(rec_id, request, policy, executor)
        finally:
            if done is not None:
                self._finish_computing(rec_id, done)

    def _compute_comparison(self, rec_id: int, request: dict[str, Any], policy: Policy | None, executor: str | None) -> None:
        from validator.judging.report import comparison_json

        with self.session() as s, s.begin():
            rec = store.get_comparison(s, id=rec_id)
            assert rec is not None
            rec.status = "running"
        try:
            floor = tuple(request["floor"]) if request["floor"] else None
            c = self.compare(request["a"], request["b"], policy=policy, floor=floor, allow_paths=False, executor=executor)
            with cycle_collector_paused():  # the report's ~10 dicts and lists a pair die by reference counting
                result, verdict, status, error = json.loads(comparison_json(c)), c.verdict, "done", None
        except Exception as exc:  # recorded, shown to the client; never lost
            result, verdict, status, error = None, None, "error", f"{type(exc).__name__}: {exc}"[:2000]
        with self.session() as s, s.begin():
            rec = store.get_comparison(s, id=rec_id)
            assert rec is not None
            rec.status, rec.verdict, rec.result, rec.error = status, verdict, result, error

    def get_comparison(self, id: int) -> dict[str, Any]:
        with self.session() as s:
            rec = store.get_comparison(s, id=id)
            if rec is None:
                raise NotFoundError(f"no comparison {id}")
            return _comparison_dict(rec)


def _readable(parse: Callable[[str], object], text: str) -> bool:
    try:
        parse(text)
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=1 << 12)
def _shape(text: str) -> tuple[int, ...]:
    """A stored record's shape, decoded once per distinct JSON text: most records of a run share a few."""
    return store.shape_of(text)


@functools.lru_cache(maxsize=1 << 16)
def _placement(slot: str) -> tuple[Coords, ShardSpec]:
    """A stored record's coordinates and shard spec, decoded once per distinct ``slot`` text (both are
    immutable): the records of one layer and step, and both runs of a comparison, share them."""
    coords, shard = store.slot_parts(slot)
    return Coords.from_dict(coords), ShardSpec.from_dict(shard)
