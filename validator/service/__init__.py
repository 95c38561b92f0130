"""The service: every use case the faces (CLI, API, dashboard) offer, over the store (:mod:`validator.store`,
persistence only). :class:`Service` (ingest, list, show, compare, cached comparisons, expiry and gc) in
:mod:`.core`, on :class:`~.access.StoreAccess`; pushed runs (pending run, uploads, finalize) in :mod:`.uploads`;
the expiry of abandoned pending runs and the blob collection in :mod:`.expiry`; the cycle collector's pause
for large runs in :mod:`.cycle_collector`; a local caller's comparison in :mod:`.comparing` (plain paths are
read without the store's imports). Names are imported on first use: neither the pause nor a comparison of
plain paths loads the database."""

from typing import TYPE_CHECKING

from validator._exports import public

if TYPE_CHECKING:
    from validator.service.core import Progress as Progress
    from validator.service.core import RunSummary as RunSummary
    from validator.service.core import Service as Service

__getattr__, __all__ = public(
    __name__,
    {
        "core": ["Service", "RunSummary", "Progress"],
        "access": ["StoreAccess"],
        "uploads": ["create_pending", "upload_file", "upload_status", "finalize"],
        "expiry": ["Collected", "collect"],
        "cycle_collector": ["cycle_collector_paused"],
        "comparing": ["compare_refs", "compare_resolved"],
    },
)
