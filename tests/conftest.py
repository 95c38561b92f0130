from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from validator.config import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


@pytest.fixture
def service(settings: Settings) -> Iterator[object]:
    from validator.service import Service

    svc = Service(settings)
    yield svc
    svc.close()
