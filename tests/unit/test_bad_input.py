"""Bad bytes on every input path: each loader and command meets broken files (made here, in
tmp_path) and answers with one line naming the file and line, and the exit code of the table."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from iepm import tomlload
from iepm.cli import app
from iepm.config import load_config, load_config_text
from iepm.errors import (
    AnalysisError,
    ConfigError,
    ExitCode,
    LabError,
    ParseError,
    RemoteError,
    StoreError,
    UsageError,
    exit_code,
)
from iepm.lab.topology import load_topology
from iepm.remote.trust import load_agent_config
from iepm.results import Outcome, Result

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]

# name → (bytes, the message's text after "FILE:")
BROKEN: dict[str, tuple[bytes, str]] = {
    "latin-1": (b'[monitor]\nname = "caf\xe9"\n', "2: not UTF-8 (byte 0xe9 at column 12)"),
    "utf-16": ("[monitor]\n".encode("utf-16"), "1: not UTF-8 (byte 0xff at column 1)"),
    "deep-arrays": (
        b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n",
        "1: arrays or inline tables nested more than 32 deep",
    ),
    "deep-inline-tables": (
        b"[monitor]\nx = " + b"{a = " * 3000 + b"1" + b"}" * 3000 + b"\n",
        "2: arrays or inline tables nested more than 32 deep",
    ),
    "deep-multi-line": (
        b"x = [\n" + b"[\n" * 100 + b"]\n" * 101,
        "33: arrays or inline tables nested more than 32 deep",
    ),
    "nul-byte": (b"[monitor]\x00\n", "1: not valid TOML"),
    "not-toml": (b"[monitor\nname = 1\n", "1: not valid TOML"),
}

LOADERS: dict[str, Callable[[Path], object]] = {
    "targets.toml": load_config,
    "agent.toml": load_agent_config,
    "lab topology": load_topology,
}


def broken(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A broken file of ``case`` and the message expected after its name."""
    data, expected = BROKEN[case]
    path = tmp_path / "broken.toml"
    path.write_bytes(data)
    return path, expected


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", BROKEN)
def test_every_loader_reports_broken_bytes_in_one_line(
    tmp_path: Path, loader: str, case: str
) -> None:
    path, expected = broken(tmp_path, case)
    with pytest.raises(ConfigError) as err:
        LOADERS[loader](path)
    message = str(err.value)
    assert message.startswith(f"{path}:{expected}"), message
    assert "\n" not in message


# Every command that reads a TOML file, with the file as {}.
COMMANDS = {
    "validate": ["validate", "{}"],
    "run": ["run", "--config", "{}", "--once", "--no-live"],
    "agent check": ["agent", "check", "{}"],
    "agent": ["agent", "--listen", "127.0.0.1:1", "--config", "{}"],
    "lab up": ["lab", "up", "{}"],
    "export --config": ["export", "--probe", "ping", "--config", "{}"],
    "alerts --config": ["alerts", "--config", "{}"],
    "study list --config": ["study", "list", "--config", "{}"],
    "tune --config": ["tune", "x", "--config", "{}"],
    "target check": ["target", "check", "x", "--config", "{}"],
    "probe --config": ["probe", "ping", "x", "--config", "{}"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", ["latin-1", "deep-arrays", "not-toml"])
def test_every_command_that_loads_a_file_fails_in_one_line(
    tmp_path: Path, command: str, case: str
) -> None:
    path, expected = broken(tmp_path, case)
    argv = [str(path) if a == "{}" else a for a in COMMANDS[command]]
    result = runner.invoke(app, argv)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr == f"error: {path}:{expected}" + result.stderr.split(expected, 1)[1]
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_validate_refuses_monitor_names_and_archive_urls_that_cannot_work(
    tmp_path: Path,
) -> None:
    long_name = "a" * 100_000
    cases = {
        'name = "a\\nb"': "2: monitor.name: monitor names are",
        'name = "../x"': "2: monitor.name: monitor names are",
        f'name = "{long_name}"': "2: monitor.name: monitor names are",
        'archive = "mysql://x/y"': "2: monitor.archive: names an unsupported database",
        'archive = "postgresql+nodriver://h/db"': "2: monitor.archive: names an "
        "unknown database driver",
        'archive = "postgresql+asyncpg://h/db"': "2: monitor.archive: driver "
        "'asyncpg' is asynchronous",
        'archive = "sqlite://"': "2: monitor.archive: an SQLite archive URL must",
        'archive = "sqlite:///:memory:"': "2: monitor.archive: an SQLite archive",
        'archive = "not a url"': "2: monitor.archive: not a database URL",
        'archive = "sqlite:///a\\n.db"': "2: monitor.archive: the archive URL "
        "contains a control character",
    }
    for line, expected in cases.items():
        path = tmp_path / "targets.toml"
        path.write_text(f"[monitor]\n{line}\n")
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == ExitCode.USAGE, line
        assert result.stderr.startswith(f"error: {path}:{expected}"), result.stderr
        assert len(result.stderr) < 400  # the 100,000 characters are not echoed back
    ok = load_config_text('[monitor]\nname = "mon-1.slac"\narchive = "sqlite:///x/a.db"\n')
    assert ok.monitor.name == "mon-1.slac"
    pg = load_config_text('[monitor]\narchive = "postgresql+psycopg://u@h/db"\n')
    assert pg.monitor.archive.startswith("postgresql")


def test_the_exit_code_table() -> None:
    assert exit_code(ConfigError("x")) == 2
    assert exit_code(UsageError("x")) == 2
    assert exit_code(AnalysisError("x")) == 2
    assert exit_code(ParseError("x")) == 1
    assert exit_code(StoreError("x")) == 3
    assert exit_code(RemoteError("x")) == 4
    assert exit_code(LabError("x")) == 5
    from iepm.tuning.sweep import StudyRefused

    assert exit_code(StudyRefused("x")) == 2  # a subclass takes its nearest class's code


def test_the_readme_documents_the_table() -> None:
    readme = (REPO / "README.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} |" in readme, code


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
        ("2026-11-01T12:00:00Z", datetime(2026, 11, 1, 12, tzinfo=UTC)),
        ("2026-11-01T12:00:00+02:00", datetime(2026, 11, 1, 10, tzinfo=UTC)),
        ("9999-12-31T23:59:59", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ],
)
def test_one_date_parser(value: str, expected: datetime) -> None:
    from iepm.cliglue import parse_moment

    assert parse_moment(value, "--since") == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--probe", "ping", "--db", "{db}", "--since", "yesterday"],
        ["alerts", "--db", "{db}", "--since", "yesterday"],
        ["study", "mathis", "--db", "{db}", "--since", "yesterday"],
        ["export", "--probe", "ping", "--db", "{db}", "--until", "9999-12-31T23:00:00-05:00"],
    ],
)
def test_bad_dates_are_usage_errors_everywhere(tmp_path: Path, argv: list[str]) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    result = runner.invoke(app, [a.replace("{db}", db) for a in argv])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.startswith("error: --")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--probe", "ping"],
        ["alerts"],
        ["study", "list"],
        ["study", "cpu"],
        ["study", "show", "abc"],
        ["serve", "--listen", "127.0.0.1:1"],
    ],
)
def test_reading_commands_never_create_an_archive(tmp_path: Path, argv: list[str]) -> None:
    missing = tmp_path / "sub" / "nonexistent.db"
    result = runner.invoke(app, [*argv, "--db", f"sqlite:///{missing}"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "does not exist" in result.stderr
    assert not missing.exists() and not missing.parent.exists()


def test_a_db_url_that_cannot_work_is_a_usage_error(tmp_path: Path) -> None:
    for argv in (["export", "--probe", "ping"], ["alerts"], ["study", "list"]):
        result = runner.invoke(app, [*argv, "--db", "mysql://x/y"])
        assert result.exit_code == ExitCode.USAGE
        assert "unsupported database 'mysql'" in result.stderr


def test_neither_db_nor_config(tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", "--probe", "ping"])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr == "error: give --db URL or --config FILE to say which archive to use\n"


def test_parse_reads_bad_bytes_as_the_runner_does(tmp_path: Path) -> None:
    fixture = Path("/work/shared/data/fixtures")
    sample = next(iter(sorted(fixture.rglob("*ping*.out"))), None) if fixture.exists() else None
    good = sample.read_bytes() if sample else b""
    for name, data in {
        "latin-1": b"PING 198.18.0.1 (198.18.0.1) 56(84) bytes \xe9\xff\n",
        "binary": bytes(range(256)) * 4,
        "utf-16": "PING x\n".encode("utf-16"),
        "deep-json": b"[" * 100_000,
        "spliced": good[: len(good) // 2] + b"\xff\xfe\x00" + good[len(good) // 2 :],
    }.items():
        path = tmp_path / f"{name}.out"
        path.write_bytes(data)
        for probe in ("ping", "traceroute", "iperf3", "load"):
            result = runner.invoke(app, ["parse", probe, str(path), "--json"])
            assert result.exit_code in (0, 1), (name, probe, result.output)
            assert result.exception is None or isinstance(result.exception, SystemExit)
            envelope = json.loads(result.stdout)
            assert envelope["succeeded"] or str(path) in envelope["error"]


def test_bad_series_bytes_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_bytes(b"timestamp,value\n2026-01-01T00:00:00Z,1\n2026-01-01T01:00:00Z,\xff2\n")
    result = runner.invoke(app, ["forecast", "--csv", str(path)])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr == f"error: {path}:3: not UTF-8 (byte 0xff at column 22)\n"


def _export(tmp_path: Path, fmt: str, *extra: str) -> Path:
    """An archive written by the real writer, exported by `iepm export`."""
    from iepm.store import Archive

    db = f"sqlite:///{tmp_path / 'a.db'}"
    start = datetime(2026, 11, 1, tzinfo=UTC)
    with Archive.open(db) as archive:
        for i in range(60):
            for target in ("cern-1", "fnal"):
                failed = i % 10 == 3
                archive.add(
                    Result(
                        probe="iperf3",
                        tool="iperf3",
                        monitor="vm",
                        target=target,
                        target_address="198.18.0.2",
                        started_at=start + timedelta(hours=i, minutes=5 * (target == "fnal")),
                        duration_s=10.0,
                        outcome=Outcome.FAILED if failed else Outcome.OK,
                        succeeded=not failed,
                        error='refused, "busy"\nretry later' if failed else None,
                        data={} if failed else {"throughput_bps": 9e8 + (i > 30) * 3e8 + i},
                    )
                )
    out = tmp_path / f"e.{fmt}"
    argv = ["export", "--probe", "iperf3", "--db", db, "--format", fmt, "-o", str(out), *extra]
    done = runner.invoke(app, argv)
    assert done.exit_code == 0, done.output
    return out


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_an_export_is_a_series_for_every_analysis(tmp_path: Path, fmt: str) -> None:
    path = _export(tmp_path, fmt, "--target", "cern-1")
    if fmt == "csv":  # the failed runs' errors hold a comma, quotes and a line break
        with path.open(newline="") as f:
            assert any("\n" in row["error"] for row in csv.DictReader(f))
    for command in ("forecast", "changes", "diurnal"):
        result = runner.invoke(app, [command, "--csv", str(path), "--json"])
        assert result.exit_code == 0, (command, result.output)
    changes = json.loads(runner.invoke(app, ["changes", "--csv", str(path), "--json"]).stdout)
    assert [c["direction"] for c in changes] == ["up"]
    forecast = json.loads(runner.invoke(app, ["forecast", "--csv", str(path), "--json"]).stdout)
    assert len(forecast) > 0 and all(f["observed"] >= 9e8 for f in forecast)
    by_column = runner.invoke(app, ["changes", "--csv", str(path), "--column", "duration_s"])
    assert by_column.exit_code == 0, by_column.output
    assert by_column.stdout.splitlines()[1:] == []  # 10 s every time: no change


def test_an_export_of_two_paths_or_an_unknown_column_says_what_to_do(tmp_path: Path) -> None:
    path = _export(tmp_path, "csv")
    result = runner.invoke(app, ["forecast", "--csv", str(path)])
    assert result.exit_code == ExitCode.USAGE
    assert "rows of more than one path (vm → cern-1, then vm → fnal)" in result.stderr
    assert "--target" in result.stderr and result.stderr.count("\n") == 1
    result = runner.invoke(app, ["forecast", "--csv", str(path), "--column", "nope"])
    assert result.exit_code == ExitCode.USAGE
    assert f"{path}:1: no column 'nope'" in result.stderr and "throughput_bps" in result.stderr


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_toml_loading_never_tracebacks_on_any_bytes(data: bytes) -> None:
    try:
        doc = tomlload.parse(tomlload.utf8.decode(data, "f.toml", ConfigError), "f.toml")
    except ConfigError as exc:
        assert str(exc).startswith("f.toml")
        return
    assert isinstance(doc.data, dict)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="[]{}=a,\"'#\n x1.", max_size=200))
def test_config_loading_never_tracebacks_on_toml_like_text(text: str) -> None:
    try:
        load_config_text(text)
    except ConfigError as exc:
        assert str(exc).startswith("<config>")


def test_target_add_names_the_bad_byte_of_the_config_it_appends_to(tmp_path: Path) -> None:
    path, expected = broken(tmp_path, "latin-1")
    result = runner.invoke(app, ["target", "add", "x", "198.18.0.5", "--config", str(path)])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr == f"error: {path}:{expected}\n"
    assert path.read_bytes() == BROKEN["latin-1"][0]  # nothing appended


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60), st.binary(min_size=1, max_size=3), st.text(max_size=20))
def test_the_bad_byte_is_named_where_it_is(before: str, bad: bytes, after: str) -> None:
    data = before.encode() + bad + after.encode()
    try:
        expected = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        assert exc.start >= len(before.encode())  # the bytes before it are valid UTF-8
        head = data[: exc.start]
        line, column = head.count(b"\n") + 1, len(head.split(b"\n")[-1]) + 1
        with pytest.raises(ConfigError) as err:
            tomlload.utf8.decode(data, "f", ConfigError)
        assert str(err.value) == (
            f"f:{line}: not UTF-8 (byte 0x{data[exc.start]:02x} at column {column})"
        )
    else:
        assert tomlload.utf8.decode(data, "f", ConfigError) == expected.removeprefix("\ufeff")
