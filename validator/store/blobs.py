"""The blob store: content-addressed bytes. Paths come only from sha256 digests, never from names.

One small interface, :class:`BlobStore`, with two implementations: the local content-addressed directory
(the embedded default) and S3-compatible object storage (:mod:`validator.store.blobs_s3`), chosen by a URL in
settings (:mod:`validator.store.blob_url`). Writes never overwrite an existing object.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import platform
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from validator.errors import InputError, StorageError
from validator.runs.tensorfile import raw_tensor

if TYPE_CHECKING:
    import torch

__all__ = ["BlobStore", "Durability", "LocalBlobStore", "check_sha", "write_temp", "temp_prefix", "stale_temp", "remove_stale_temp"]

_SHA_RE = re.compile(r"[0-9a-f]{64}")
SMALL_BLOB = 1 << 20  # bytes: blobs no larger are read into memory by LocalBlobStore.open_tensor
# Reads are checked against the blob's digest, as S3 reads are: a small blob's bytes as read, a larger one's
# file once per version of it in this process (LocalBlobStore._verify_file): blob -> the version checked
_VERIFIED: dict[str, tuple[int, ...]] = {}
_VERIFIED_MAX = 1 << 18
_CORRUPT = "blob {sha} in {root} does not match its digest (damaged on disk; `validator check` lists such blobs)"


def check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA_RE.fullmatch(sha256):
        raise InputError(f"not a sha256 digest: {sha256!r}")
    return sha256


class Durability:
    """Blobs written as one batch (one run's tensors): each write skips its own fsyncs, and :meth:`flush`
    makes them all durable at once, before anything that points at them is committed.

    On Linux (5.8 or later) that is one ``syncfs`` of the blob store's file system: it writes back every file
    and directory there, flushes the device's cache, and fails if any write back on that file system failed
    since the batch began (a full disk, an I/O error). Elsewhere, one ``os.sync`` and then an ``fsync`` of
    each file and directory, which reports the write errors of that file. Use it as a context manager (it
    holds a descriptor of each file system it watches)."""

    def __init__(self) -> None:
        self.paths: list[str | Path] = []
        self._watched: dict[Path, int] = {}

    def watch(self, directory: Path) -> None:
        """Called before writing into ``directory``: from now on, write errors there are reported by flush."""
        if _SYNCFS is not None and directory not in self._watched:
            self._watched[directory] = os.open(directory, os.O_RDONLY)

    def add(self, *paths: str | Path) -> None:
        if _SYNCFS is None:
            self.paths.extend(paths)

    def flush(self) -> None:
        for directory, fd in self._watched.items():
            if _SYNCFS is not None and _SYNCFS(fd) != 0:
                err = ctypes.get_errno()
                raise StorageError(f"cannot make the blob store durable ({directory.name}): {os.strerror(err)}")
        if self.paths:
            os.sync()
            for p in dict.fromkeys(self.paths):  # each file and directory once; nothing is left to write
                _fsync_path(p)
            self.paths.clear()

    def close(self) -> None:
        for fd in self._watched.values():
            os.close(fd)
        self._watched.clear()

    def __enter__(self) -> Durability:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _find_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` where it reports write errors (Linux 5.8 and later), else None."""
    if not sys.platform.startswith("linux"):
        return None
    m = re.match(r"([0-9]+)\.([0-9]+)", platform.release())
    if m is None or (int(m.group(1)), int(m.group(2))) < (5, 8):
        return None
    try:
        fn: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return fn


_SYNCFS = _find_syncfs()


def _fsync_path(p: str | Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"cannot make {os.path.basename(p)} durable in the blob store: {exc.strerror or exc}") from None


class BlobStore(Protocol):
    def put(
        self, chunks: Iterable[bytes | memoryview], *, expect_sha256: str | None = None, batch: Durability | None = None
    ) -> tuple[str, int, bool]:
        """Store bytes; returns (sha256, size, created). Refuses content not matching ``expect_sha256``.
        With ``batch``, the bytes are durable only once ``batch.flush()`` returns."""
        ...

    def exists(self, sha256: str) -> bool: ...

    def delete(self, sha256: str) -> None: ...

    def path(self, sha256: str) -> Path:
        """A local file holding the blob (object stores download it into a local cache first)."""
        ...

    def open_tensor(self, sha256: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> torch.Tensor: ...

    def read_into(self, sha256: str, out: memoryview) -> None:
        """The blob's bytes into ``out``, which is as long as the blob (a batch of small tensors read side by
        side into one buffer: ``runs.reassembly.materialize_many``)."""
        ...


def temp_prefix(kind: str = "tmp") -> str:
    """Prefix of a temporary file or directory: it names the owning process, so that a later process can
    tell a crashed writer's leftovers (see :func:`remove_stale_temp`) from a live writer's files."""
    return f"{kind}.{os.getpid()}."


_TEMP_RE = re.compile(r"[a-z]+\.([0-9]+)\..*")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not reaped yet is a zombie: dead
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stale_temp(directory: Path, *, kinds: tuple[str, ...]) -> list[Path]:
    """Entries of ``directory`` named by :func:`temp_prefix` with one of ``kinds`` whose owning process is
    gone (and entries named ``KIND...`` without an owner, left by older versions)."""
    out = []
    for p in sorted(directory.iterdir()) if directory.is_dir() else ():
        m = _TEMP_RE.fullmatch(p.name)
        if m and p.name.split(".", 1)[0] in kinds:
            if _alive(int(m.group(1))):
                continue
        elif not p.name.startswith(kinds):
            continue
        out.append(p)
    return out


def remove_stale_temp(directory: Path, *, kinds: tuple[str, ...]) -> list[Path]:
    """Remove :func:`stale_temp` entries of ``directory``; returns what was removed."""
    import shutil

    removed = stale_temp(directory, kinds=kinds)
    for p in removed:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return removed


_TEMP_SERIAL = itertools.count()


def _new_temp(tmp_dir: Path) -> tuple[int, str]:
    """A new file in ``tmp_dir`` named by :func:`temp_prefix` and a serial number (a third of the cost of
    ``tempfile.mkstemp``'s random names with a buffered file object, for ~100k tiny blobs a run)."""
    while True:
        path = os.path.join(tmp_dir, f"{temp_prefix()}{next(_TEMP_SERIAL)}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path
        except FileExistsError:  # left by an earlier process that had our pid
            continue


def write_temp(
    tmp_dir: Path, chunks: Iterable[bytes | memoryview], expect_sha256: str | None, *, fsync: bool = True
) -> tuple[str, str, int]:
    """Spool ``chunks`` to a temporary file in ``tmp_dir``, hashing on the way: (tmp path, sha256, size).
    A failed write (disk full, quota) is a :class:`StorageError` and leaves no file behind. ``fsync=False``:
    the caller makes the bytes durable later (:class:`Durability`)."""
    h = hashlib.sha256()
    size = 0
    try:
        fd, tmp = _new_temp(tmp_dir)
    except OSError as exc:
        raise StorageError(f"cannot write to the blob store ({tmp_dir}): {exc.strerror or exc}") from None
    writing = False  # an OSError while writing (not while producing the chunks) is the store's
    try:
        try:
            for c in chunks:
                h.update(c)
                writing = True
                view = memoryview(c)
                while view:
                    view = view[os.write(fd, view) :]
                writing = False
                size += len(c)
            writing = True
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        os.unlink(tmp)
        if not writing:
            raise
        raise StorageError(f"cannot write to the blob store ({tmp_dir}): {exc.strerror or exc}") from None
    except BaseException:
        os.unlink(tmp)
        raise
    sha = h.hexdigest()
    if expect_sha256 is not None and sha != expect_sha256:
        os.unlink(tmp)
        raise InputError(f"content hash mismatch: record says {expect_sha256}, bytes hash to {sha}")
    return tmp, sha, size


class LocalBlobStore:
    """``ROOT/ab/cdef...``: one file per distinct content; ``ROOT/tmp`` holds writes in progress."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._root = str(self.root)

    def path(self, sha256: str) -> Path:
        return Path(self._file(sha256))

    def _file(self, sha256: str) -> str:
        check_sha(sha256)
        return f"{self._root}/{sha256[:2]}/{sha256[2:]}"

    def exists(self, sha256: str) -> bool:
        return os.path.exists(self._file(sha256))

    def put(
        self, chunks: Iterable[bytes | memoryview], *, expect_sha256: str | None = None, batch: Durability | None = None
    ) -> tuple[str, int, bool]:
        if batch is not None:
            batch.watch(self.root)
        tmp, sha, size = write_temp(self.tmp, chunks, expect_sha256, fsync=batch is None)
        try:
            dest = self._file(sha)
            parent = os.path.dirname(dest)
            new_dir = False
            try:
                try:
                    os.link(tmp, dest)  # fails if it exists: never overwrite
                except FileNotFoundError:  # the first blob of its directory
                    os.makedirs(parent, exist_ok=True)
                    new_dir = True
                    os.link(tmp, dest)
                created = True
                # make the name durable too before a run can point at it (the bytes are, or will be with the batch)
                dirs = (parent, self._root) if new_dir else (parent,)
                if batch is not None:
                    batch.add(dest, *dirs)
                for d in dirs if batch is None else ():
                    fd = os.open(d, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            except FileExistsError:
                created = False
            except OSError as exc:
                raise StorageError(f"cannot write to the blob store ({self.root}): {exc.strerror or exc}") from None
        finally:
            os.unlink(tmp)
        if created and size > SMALL_BLOB:  # hashed as written: a read in this process need not hash it again
            st = os.stat(dest)  # after the unlink, which changes its change time
            _VERIFIED[sha] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return sha, size, created

    def delete(self, sha256: str) -> None:
        Path(self._file(sha256)).unlink(missing_ok=True)

    def open_tensor(self, sha256: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> torch.Tensor:
        """The blob as a tensor: read into memory up to SMALL_BLOB bytes (one read, where a memory map costs
        more than the bytes), memory-mapped copy-on-write beyond."""
        import torch

        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        if nbytes > SMALL_BLOB:
            path = Path(self._file(sha256))
            try:
                self._verify_file(sha256, path)
                return raw_tensor(path, 0, nbytes, dtype, shape)
            except FileNotFoundError:
                raise InputError(f"blob {sha256} is missing from {self.root}") from None
        # a bytearray the tensor is made on: two torch calls fewer than a uint8 tensor viewed as the dtype
        buf = bytearray(nbytes)
        self.read_into(sha256, memoryview(buf))
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)

    def read_into(self, sha256: str, out: memoryview) -> None:
        # os.open and one readv: no file object, no fstat (a small blob's read costs little more than those calls)
        try:
            fd = os.open(self._file(sha256), os.O_RDONLY)
        except FileNotFoundError:
            raise InputError(f"blob {sha256} is missing from {self.root}") from None
        try:
            got = os.readv(fd, [out])
        finally:
            os.close(fd)
        if got != len(out):
            raise InputError(f"blob {sha256} in {self.root} is shorter than its record's {len(out)} bytes")
        if hashlib.sha256(out).hexdigest() != sha256:
            raise InputError(_CORRUPT.format(sha=sha256, root=self.root))

    def _verify_file(self, sha256: str, path: Path) -> None:
        """The file's bytes hash to its name, checked once per version of the file in this process (a version:
        its device, inode, size and modification and change times; editing a file changes its change time)."""
        st = path.stat()
        version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if _VERIFIED.get(sha256) == version:
            return
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != sha256:
            raise InputError(_CORRUPT.format(sha=sha256, root=self.root))
        if len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.clear()
        _VERIFIED[sha256] = version


_SHARD_DIR = re.compile(r"[0-9a-f]{2}")
_BLOB_NAME = re.compile(r"[0-9a-f]{62}")


def blob_files(root: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """A local blob store's blob files as (sha256, path), and every other entry in it but ``tmp/`` (its
    write spool): foreign files and folders, as paths relative to ``root`` (``validator check`` and
    ``validator gc`` report them and touch none)."""
    found: list[tuple[str, Path]] = []
    foreign: list[str] = []
    for d in sorted(root.iterdir()) if root.is_dir() else ():
        if d.name == "tmp" and d.is_dir() and not d.is_symlink():
            continue
        if not (_SHARD_DIR.fullmatch(d.name) and d.is_dir() and not d.is_symlink()):
            foreign.append(d.name + ("/" if d.is_dir() else ""))
            continue
        for f in sorted(d.iterdir()):
            if _BLOB_NAME.fullmatch(f.name) and f.is_file() and not f.is_symlink():
                found.append((d.name + f.name, f))
            else:
                foreign.append(f"{d.name}/{f.name}" + ("/" if f.is_dir() else ""))
    return found, foreign
