"""What every use case works through: the settings, the database (engine and sessions, migrated) and the
blob store, opened once per process. :class:`~validator.service.core.Service` is one; the expiry of pending
runs (:mod:`.expiry`) needs no more than this."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy.orm import Session

from validator.settings import Settings
from validator.store import crud as store
from validator.store.blob_url import open_blob_store

__all__ = ["StoreAccess"]


class StoreAccess:
    """The store of ``settings``, opened: ``engine``, ``sessions`` (and :meth:`session`), ``blobs``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.engine = store.make_engine(settings.db_url)
        store.migrate(self.engine)
        self.sessions = store.make_sessionmaker(self.engine)
        self.blobs = open_blob_store(settings.blob_url, local_dir=settings.blob_dir, cache_dir=settings.cache_dir)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as s:
            yield s

    def discard_blobs(self, created: list[str]) -> None:
        """After a failed ingest or upload: delete the blobs it created that nothing references (see
        ``store.crud.blob_gc_lock``)."""
        if not created:
            return
        with self.session() as s, s.begin():
            store.blob_gc_lock(s, exclusive=True)
            gone = store.unreferenced_blobs(s, candidates=created)
            for sha in gone:
                self.blobs.delete(sha)
            store.delete_blob_rows(s, shas=gone)
