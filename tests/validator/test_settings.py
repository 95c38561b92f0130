"""Settings from the environment (issue 39, item 9): a bad value is a usage error naming the variable and the
problem (InputError: exit 2), for every variable read, for the CLI and for `validator serve` alike."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from validator.errors import InputError
from validator.settings import Settings

EXE = str(Path(sys.executable).parent / "validator")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("VALIDATOR_MAX_UPLOAD_BYTES", "abc", "VALIDATOR_MAX_UPLOAD_BYTES='abc' is not a whole number"),
        ("VALIDATOR_MAX_UPLOAD_BYTES", "0", "VALIDATOR_MAX_UPLOAD_BYTES='0' is out of range: it must be between 1 and"),
        ("VALIDATOR_MAX_UPLOAD_BYTES", "1" * 5000, "VALIDATOR_MAX_UPLOAD_BYTES='1111.* is not a whole number"),
        ("VALIDATOR_MAX_UPLOAD_BYTES", str(1 << 63), "is out of range"),
        ("VALIDATOR_DATABASE_URL", "foo://bar", "VALIDATOR_DATABASE_URL='foo://bar': no database dialect 'foo'"),
        ("VALIDATOR_DATABASE_URL", "foo", "VALIDATOR_DATABASE_URL='foo' is not a database URL"),
        ("VALIDATOR_DATABASE_URL", "postgresql+nodriver://h/db", "no database dialect 'postgresql\\+nodriver'"),
        ("VALIDATOR_DATABASE_URL", "mysql+mysqldb://h/db", "its database driver is not installed"),
        ("VALIDATOR_PROTECT_READS", "maybe", "VALIDATOR_PROTECT_READS='maybe' is not a yes or no"),
        ("VALIDATOR_PENDING_EXPIRY_HOURS", "soon", "VALIDATOR_PENDING_EXPIRY_HOURS='soon' is not a number"),
        ("VALIDATOR_PENDING_EXPIRY_HOURS", "nan", "is not a finite number"),
        ("VALIDATOR_BLOB_URL", "ftp://host/x", "VALIDATOR_BLOB_URL='ftp://host/x' is not a blob store URL"),
        ("VALIDATOR_BLOB_URL", "s3:///prefix", "VALIDATOR_BLOB_URL='s3:///prefix': needs a bucket"),
        ("VALIDATOR_BLOB_URL", "file://", "file:// needs a path"),
        ("VALIDATOR_COMPARE_EXECUTOR", "spark", "VALIDATOR_COMPARE_EXECUTOR: executor 'spark': use local, ray"),
    ],
)
def test_a_bad_variable_is_named(tmp_path: Path, key: str, value: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as exc:
        Settings.from_env({"VALIDATOR_HOME": str(tmp_path), key: value})
    assert str(exc.value).startswith(key)


def test_a_password_is_never_shown(tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        Settings.from_env({"VALIDATOR_HOME": str(tmp_path), "VALIDATOR_DATABASE_URL": "foo://user:s3cret@host/db"})
    assert "s3cret" not in str(exc.value) and "foo://***@host/db" in str(exc.value)


def test_home_must_be_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="^VALIDATOR_HOME=.* is not a directory"):
        Settings.from_env({"VALIDATOR_HOME": str(f)})
    with pytest.raises(InputError, match="^--home=.* is not a directory"):
        Settings.from_env({}, home=str(f))


def test_good_values(tmp_path: Path) -> None:
    env = {"VALIDATOR_HOME": str(tmp_path), "VALIDATOR_MAX_UPLOAD_BYTES": " 1024 ", "VALIDATOR_PROTECT_READS": "TRUE",
           "VALIDATOR_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", "VALIDATOR_BLOB_URL": "s3://bucket/p?endpoint=http://h:9000",
           "VALIDATOR_COMPARE_EXECUTOR": "ray=127.0.0.1:6379", "VALIDATOR_PENDING_EXPIRY_HOURS": "0.5"}
    s = Settings.from_env(env)
    assert (s.max_upload_bytes, s.protect_reads, s.compare_executor, s.pending_expiry_hours) == (1024, True, "ray=127.0.0.1:6379", 0.5)
    for off in ("", "0", "no", "False", "off"):
        assert not Settings.from_env({"VALIDATOR_HOME": str(tmp_path), "VALIDATOR_PROTECT_READS": off}).protect_reads
    d = Settings.from_env({"VALIDATOR_HOME": str(tmp_path)})
    assert (d.max_upload_bytes, d.database_url, d.blob_url, d.compare_executor) == (64 << 30, None, None, "local")


def test_fields_set_in_code_are_checked_too(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    with pytest.raises(InputError, match="^--db='foo://bar': no database dialect"):  # how `--db` arrives
        replace(s, database_url="foo://bar")
    with pytest.raises(InputError, match="max_upload_bytes must be a whole number of bytes"):
        replace(s, max_upload_bytes=0)


def _validator(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATOR_")}
    full.update({"VALIDATOR_HOME": str(tmp_path / "h"), **env})
    return subprocess.run([EXE, *args], capture_output=True, text=True, env=full, timeout=60)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VALIDATOR_MAX_UPLOAD_BYTES": "abc"}, "VALIDATOR_MAX_UPLOAD_BYTES='abc' is not a whole number (e.g. 68719476736)"),
        ({"VALIDATOR_DATABASE_URL": "foo://bar"}, "VALIDATOR_DATABASE_URL='foo://bar': no database dialect 'foo'"),
    ],
)
def test_console_script_exits_2_naming_the_variable(tmp_path: Path, env: dict[str, str], message: str) -> None:
    """The installed `validator`: a command and the server refuse to start, with the same one-line message."""
    for args in (["runs"], ["serve", "--port", "1"]):
        got = _validator(tmp_path, env, *args)
        assert got.returncode == 2, (args, got.stderr)
        assert got.stderr.startswith(f"validator: error: {message}") and got.stderr.count("\n") == 1, got.stderr
        assert got.stdout == ""
    r2 = _validator(tmp_path, {}, "--db", "foo://bar", "runs")
    assert r2.returncode == 2 and r2.stderr.startswith("validator: error: --db='foo://bar': no database dialect"), r2.stderr


def test_client_and_executor_settings_come_from_the_environment() -> None:
    from validator.settings import RANGE_BYTES, ClientSettings, ExecutorSettings

    assert ClientSettings.from_env({}) == ClientSettings(server=None, token=None, debug=False, step_summary=None)
    assert ClientSettings.from_env({"GITHUB_STEP_SUMMARY": ""}).step_summary is None  # set but empty: no summary file
    got = ClientSettings.from_env(
        {"VALIDATOR_SERVER": "http://h:8000", "VALIDATOR_TOKEN": "s3cret-tok", "VALIDATOR_DEBUG": "1", "GITHUB_STEP_SUMMARY": "/tmp/summary.md"}
    )
    assert (got.server, got.token, got.debug, got.step_summary) == ("http://h:8000", "s3cret-tok", True, "/tmp/summary.md")
    assert "s3cret-tok" not in repr(got)  # the token is never shown
    assert ExecutorSettings.from_env({}) == ExecutorSettings(ray_address=None, range_bytes=RANGE_BYTES)
