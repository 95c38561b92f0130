from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from validator.settings import Settings

# Tests that take a database run on SQLite always, and on PostgreSQL too when VALIDATOR_TEST_POSTGRES_URL
# points at a server (scripts/test starts one; CI installs it).
PG_URL = os.environ.get("VALIDATOR_TEST_POSTGRES_URL")


def _fresh_pg_database(base_url: str) -> Iterator[str]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"vt_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite"] + (["postgresql"] if PG_URL else []))
def db_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
    else:
        assert PG_URL
        yield from _fresh_pg_database(PG_URL)


@pytest.fixture
def settings(tmp_path: Path, db_url: str | None) -> Settings:
    return Settings(home=tmp_path / "home", database_url=db_url)


@pytest.fixture
def service(settings: Settings) -> Iterator[object]:
    from validator.service import Service

    svc = Service(settings)
    yield svc
    svc.close()
