"""The store: the only package that writes SQL (:mod:`.crud`, keyword-only functions taking a session, over
the models in :mod:`.models`), the content-addressed blob stores (local directory, S3), and the store's integrity check.
Use cases over it (uploads, expiry) live in :mod:`validator.service`."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {
        "crud": ["make_engine", "make_sessionmaker", "migrate"],
        "models": ["Base", "Run", "Tensor", "Blob", "Artifact", "Upload", "ComparisonRecord"],
        "blobs": ["BlobStore", "LocalBlobStore"],
        "blob_url": ["open_blob_store"],
        "blobs_s3": ["S3BlobStore"],
        "blob_read": ["open_blob_tensor", "open_file_tensor"],
        "integrity": ["check_store"],
    },
)
