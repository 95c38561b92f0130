"""The executor setting's syntax (``--executor``, ``VALIDATOR_COMPARE_EXECUTOR``): ``local``, ``ray`` or
``ray=ADDRESS``. Plain text checks: neither Ray nor torch is imported."""

from __future__ import annotations

import re
from dataclasses import dataclass

from validator.errors import InputError

__all__ = ["ExecutorSpec", "parse_executor", "ray_hostport"]


@dataclass(frozen=True)
class ExecutorSpec:
    """Where a comparison measures its pairs: ``local`` (this process) or ``ray`` (``address`` None: the
    cluster of ``RAY_ADDRESS`` or of this machine)."""

    kind: str = "local"
    address: str | None = None

    def __str__(self) -> str:
        return self.kind if self.address is None else f"{self.kind}={self.address}"


def parse_executor(text: str | None) -> ExecutorSpec:
    """``local``, ``ray`` or ``ray=ADDRESS`` (``HOST:PORT`` of the head's GCS, or ``ray://HOST:PORT``)."""
    if not text or text == "local":
        return ExecutorSpec()
    kind, sep, address = text.partition("=")
    if kind != "ray" or (sep and not address.strip()):
        raise InputError(f"executor {text[:200]!r}: use local, ray or ray=ADDRESS (HOST:PORT of the Ray head, or ray://HOST:PORT)")
    if sep:
        ray_hostport(address.strip())
    return ExecutorSpec("ray", address.strip() or None)


# a DNS name or IPv4 address (at most 253 characters, labels of at most 63), or an IPv6 address in brackets
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]")


def _good_host(host: str) -> bool:
    if _IPV6.fullmatch(host):
        return True
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.removesuffix(".").split("."))


def ray_hostport(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``ray://HOST:PORT`` -> (host, port); anything else is an :class:`InputError`."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not _good_host(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"Ray address {address[:200]!r}{'...' if len(address) > 200 else ''}: use HOST:PORT (the head's GCS port, "
            "6379 by default) or ray://HOST:PORT, HOST a name or IP address"
        )
    return host.strip("[]"), int(port)
