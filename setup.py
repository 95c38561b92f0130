"""The package list, which pyproject.toml cannot express: the packages under validator/ and probes/, plus the
top-level dashboards/ and migrations/ folders mapped into the package as ``validator._data.dashboards`` and
``validator._data.migrations`` (see validator/_data), each subfolder a package of its own so that setuptools
ships its files (package-data in pyproject.toml). Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, find_packages, setup

DATA = {"validator._data.dashboards": "dashboards", "validator._data.migrations": "migrations"}


def folder(package: str, path: str) -> list[str]:
    """``package`` and one package per subfolder of ``path``."""
    return [package, *(f"{package}.{sub}" for sub in find_namespace_packages(where=path, exclude=["*__pycache__*"]))]


setup(
    packages=[
        *find_packages(include=["validator", "validator.*", "probes", "probes.*"]),
        *(p for package, path in DATA.items() for p in folder(package, path)),
    ],
    package_dir=DATA,
)
