"""The store: the only package that writes SQL (:mod:`.crud`, keyword-only functions taking a session, over
the models in :mod:`.models`), the content-addressed blob stores (local directory, S3) and resumable
uploads."""

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
        "uploads": ["create_pending", "upload_file", "upload_status", "finalize"],
        "integrity": ["check_store"],
    },
)
