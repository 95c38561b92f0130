"""Where things are, for tests at any depth: the repository root and the test data."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
