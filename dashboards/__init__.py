"""The dashboard's templates and static files. Installed as ``validator._data.dashboards`` (setup.py); found
through validator._data."""
