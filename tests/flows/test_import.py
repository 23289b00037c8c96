"""nfcapd files through nfdump: a file recorded here by nfcapd 1.7.1 from v5 and IPFIX exports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from iepm.errors import UsageError
from iepm.flows.nfimport import parse_json_lines, read_nfcapd

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/flows/nfcapd-1.7.1--v5-and-ipfix.nfcapd"
needs_nfdump = pytest.mark.skipif(shutil.which("nfdump") is None, reason="nfdump not installed")

# What the exporter sent (testkit/flow_encoder.py, 3 flows as v5 then again as IPFIX):
# start/end in Unix ms, bytes.
SENT = [
    (1795561915942, 1795561930932, 1_000_000, 40000),
    (1795561915949, 1795561930933, 2_000_000, 40001),
    (1795561915956, 1795561930934, 3_000_000, 40002),
]


@needs_nfdump
def test_nfcapd_file_reads_back_what_was_exported() -> None:
    flows = list(read_nfcapd(FIXTURE))
    assert len(flows) == 6
    got = sorted((f.start_ms, f.end_ms, f.bytes, f.sport) for f in flows)
    assert got == sorted(SENT * 2)
    assert {(f.src, f.dst, f.dport, f.proto, f.exporter) for f in flows} == {
        ("198.18.1.2", "198.18.2.2", 5201, 6, "127.0.0.1")
    }
    # nfdump numbers its exporters: the v5 and the IPFIX one stay apart (no false duplicates).
    assert sorted({f.domain for f in flows}) == [1, 2]


@needs_nfdump
def test_cli_import_twice_stores_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    argv = [sys.executable, "-m", "iepm.cli", "flows", "import", str(FIXTURE), "--db", url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    second = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("6 records, 6 new")
    assert second.stdout.strip().endswith("6 records, 0 new")


@needs_nfdump
def test_a_file_that_is_not_nfcapd_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "nfcapd.bad"
    bad.write_bytes(b"not a flow file at all" * 10)
    proc = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "flows", "import", str(bad),
         "--db", f"sqlite:///{tmp_path / 'a.db'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: nfdump -r ") and str(bad) in lines[0]


def test_bad_json_names_file_line_and_field() -> None:
    text = '[\n{\n"type" : "FLOW",\n"proto" : 6\n}\n]\n'
    with pytest.raises(UsageError, match=r"^x.json: line 2: field in_bytes missing$"):
        list(parse_json_lines(iter(text.splitlines()), "x.json"))
    text = '[\n{\n"type" : "FLOW",\n"first" : \n}\n]\n'
    with pytest.raises(UsageError, match=r"^x.json: line 2: not JSON"):
        list(parse_json_lines(iter(text.splitlines()), "x.json"))
