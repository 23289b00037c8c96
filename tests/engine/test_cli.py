"""The command line, run as a user would: a real process, real tools, loopback only."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.net import iperf3_server

pytestmark = pytest.mark.servers  # real iperf3 servers/tools (or iepm processes) on loopback

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "data" / "fixtures" / "linux-ping-traceroute"


def iepm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iepm.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_probe_ping_json_envelope() -> None:
    done = iepm("probe", "ping", "127.0.0.1", "--count", "3", "--interval", "0.2", "--json")
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["schema"] == 1
    assert envelope["probe"] == "ping" and envelope["succeeded"] is True
    assert envelope["params"]["count"] == 3 and envelope["params"]["interval_s"] == 0.2
    assert envelope["data"]["packets_received"] == 3
    assert envelope["started_at"].endswith("Z")
    assert envelope["tool_version"].startswith("ping from iputils")


def test_probe_ping_readable_summary() -> None:
    done = iepm("probe", "ping", "127.0.0.1", "--count", "2", "--interval", "0.2")
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout and "loss 0%" in done.stdout


def test_unresolvable_name_fails_with_an_actionable_error() -> None:
    done = iepm("probe", "ping", "nonexistent.invalid", "--count", "1", "--json")
    assert done.returncode == 1
    envelope = json.loads(done.stdout)
    assert envelope["succeeded"] is False
    assert "nonexistent.invalid" in envelope["error"]
    assert "ping" in envelope["diags"]


def test_option_out_of_range_is_rejected_before_running() -> None:
    done = iepm("probe", "iperf3", "127.0.0.1", "--streams", "500")
    assert done.returncode == 2
    assert "streams" in done.stderr and "128" in done.stderr


def test_iperf3_against_a_plain_server_then_export(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/a.db"
    with iperf3_server("127.0.0.1") as port:
        done = iepm(
            "probe",
            "iperf3",
            "127.0.0.1",
            "--port",
            str(port),
            "--duration",
            "1",
            "--streams",
            "2",
            "--json",
            "--store",
            db,
            "--log-dir",
            str(tmp_path / "raw"),
        )
    assert done.returncode == 0, done.stdout + done.stderr
    envelope = json.loads(done.stdout)
    assert len(envelope["data"]["streams"]) == 2
    assert list((tmp_path / "raw").glob("*/127.0.0.1.iperf3.log"))

    tsv = iepm("export", "--probe", "iperf3", "--db", db, "--format", "tsv")
    assert tsv.returncode == 0, tsv.stderr
    lines = tsv.stdout.splitlines()
    assert lines[0].startswith("#")
    rows = [line for line in lines if not line.startswith("#")]
    header, row = rows[0].split("\t"), rows[1].split("\t")
    record = dict(zip(header, row, strict=True))
    assert float(record["throughput_bps"]) == pytest.approx(envelope["data"]["throughput_bps"])

    out = tmp_path / "t.csv"
    done = iepm("export", "--probe", "iperf3", "--db", db, "--format", "csv", "-o", str(out))
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as handle:
        (record,) = list(csv.DictReader(handle))
    assert record["target"] == "127.0.0.1" and record["outcome"] == "ok"


def test_parse_a_saved_output() -> None:
    path = FIXTURES / "centos-7.7_ping-ip-dup.out"
    done = iepm("parse", "ping", str(path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)["data"]
    expected = json.loads(path.with_suffix(".json").read_text())
    assert data["packets_sent"] == expected["packets_transmitted"]
    assert data["duplicates"] == expected["duplicates"]


def test_parse_garbage_fails_clearly(tmp_path: Path) -> None:
    path = tmp_path / "junk.out"
    path.write_text("this is not ping output\n")
    done = iepm("parse", "ping", str(path), "--json")
    assert done.returncode == 1
    assert str(path) in json.loads(done.stdout)["error"]


def test_validate_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "targets.toml"
    path.write_text('[[targets]]\nname = "x"\naddress = "127.0.0.1"\n[targets.ping]\ncount = 0\n')
    done = iepm("validate", str(path))
    assert done.returncode == 2
    assert f"{path}:5: targets[0].ping.count:" in done.stderr.replace("\n", " ")
    good = REPO / "examples" / "targets.toml"
    assert iepm("validate", str(good)).returncode == 0


def test_extract_re_reads_raw_logs_into_the_archive(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/a.db"
    raw_dir = tmp_path / "raw"
    done = iepm(
        "probe",
        "ping",
        "127.0.0.1",
        "--count",
        "4",
        "--interval",
        "0.2",
        "--discard-first",
        "1",
        "--json",
        "--store",
        db,
        "--log-dir",
        str(raw_dir),
    )
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    # Same archive: the stored result is updated in place (same id), read with the same spec.
    again = iepm("extract", "--log-dir", str(raw_dir), "--db", db)
    assert again.returncode == 0, again.stderr
    assert "1 runs: 1 updated, 0 added" in again.stdout
    rows = iepm("export", "--probe", "ping", "--db", db, "--format", "json")
    (stored,) = [json.loads(line) for line in rows.stdout.splitlines()]
    # An unknown target is an error naming the known ones (exit 2), not an empty table.
    nope = iepm("export", "--probe", "ping", "--db", db, "--target", "nope")
    assert nope.returncode == 2 and nope.stdout == "", nope
    assert "--target 'nope': no results in the archive (targets: 127.0.0.1)" in nope.stderr
    assert stored["id"] == first["id"]
    assert stored["data"] == first["data"]
    assert stored["data"]["discarded"] == 1
    # A new archive: the run is added.
    fresh = iepm("extract", "--log-dir", str(raw_dir), "--db", f"sqlite:///{tmp_path}/b.db")
    assert "1 runs: 0 updated, 1 added" in fresh.stdout


def test_a_bad_probe_option_is_one_line_naming_the_option() -> None:
    done = iepm("probe", "ping", "127.0.0.1", "--count", "0", "--interval", "0.0001")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "error: --count: Input should be greater than or equal to 1 (got 0); "
        "--interval: Input should be greater than or equal to 0.002 (got 0.0001)\n"
    )
    window = iepm("probe", "iperf3", "127.0.0.1", "--window", "2X")
    assert window.returncode == 2 and window.stderr.startswith("error: --window: window '2X'")
    assert len(window.stderr.splitlines()) == 1
