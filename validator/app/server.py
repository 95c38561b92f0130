"""`validator serve`: run the app under uvicorn, refusing an open write API on a public address."""

from __future__ import annotations

import ipaddress
import sys

from validator.errors import InputError
from validator.settings import Settings

__all__ = ["serve", "is_loopback"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(settings: Settings, *, host: str, port: int, allow_open: bool = False) -> int:
    if not settings.tokens and not is_loopback(host) and not allow_open:
        raise InputError(
            f"refusing to serve on {host} without a token: pass --token (or set VALIDATOR_TOKENS), "
            "or --insecure-no-token to allow anyone to write"
        )
    import uvicorn

    from validator.app.api import create_app

    app = create_app(settings)
    print(f"validator: serving {settings.home} on http://{host}:{port}  (API: /api/v1, schema: /openapi.json)", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
