"""The web dashboard served by ``validator serve``: pages over the same Service the JSON API uses.

- :mod:`.views`: what the comparison page shows (heatmap grid, first exceedance, one page of the pairs
  table), from a comparison document
- :mod:`.drill`: where inside one tensor two runs differ (per token, per head, histogram, worst elements)
- :mod:`.pages`: each page's data, gathered through the Service (``?format=json`` returns it)

The routes live in :mod:`validator.app.api.routes.dashboard`; templates and static files in ``dashboards/``.
"""

from __future__ import annotations

from validator.app.dashboard.drill import AxisProfile, ErrorProfile, WorstElement, error_profile
from validator.app.dashboard.views import TableQuery, first_exceedance, heatmap, pair_rows, pair_table

__all__ = [
    "AxisProfile",
    "ErrorProfile",
    "WorstElement",
    "TableQuery",
    "error_profile",
    "first_exceedance",
    "heatmap",
    "pair_rows",
    "pair_table",
]
