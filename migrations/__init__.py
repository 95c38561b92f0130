"""Alembic migrations. Installed as ``validator._data.migrations`` (setup.py); found through validator._data."""
