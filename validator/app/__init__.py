"""The faces: the command line (:mod:`.cli`), the remote CLI's HTTP client, the JSON API and the dashboard
(:mod:`.api`, pure views in :mod:`.dashboard`), and ``validator serve``. Each parses input and calls
:class:`validator.service.Service`."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {"cli": ["main", "build_parser"], "client": ["Client"], "api": ["create_app"], "server": ["serve"]},
)
