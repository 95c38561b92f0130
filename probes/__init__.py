"""Production-safe capture probes for validator. Importable with torch and safetensors alone."""

from .bundle import BUNDLE_FORMAT, BUNDLE_VERSION, BundleError, BundleWriter
from .shards import Coords, ShardSpec, ShardSpecError

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "BundleError",
    "BundleWriter",
    "Coords",
    "ShardSpec",
    "ShardSpecError",
]
