"""`iepm forecast|changes|diurnal` through register(), run with typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from iepm.analysis.cli import register
from iepm.analysis.series import iso
from tests.analysis.conftest import hourly

app = typer.Typer()
register(app)
runner = CliRunner()


@pytest.fixture
def step_csv(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    y = np.r_[np.full(80, 500.0), np.full(60, 300.0)] + rng.normal(0, 3, 140)
    p = tmp_path / "step.csv"
    p.write_text(
        "timestamp,value\n"
        + "".join(f"{iso(t)},{v:.3f}\n" for t, v in zip(hourly(140), y, strict=True))
    )
    return p


def test_forecast_json_and_table(step_csv: Path) -> None:
    res = runner.invoke(app, ["forecast", "--csv", str(step_csv), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 135
    assert set(rows[0]) >= {"timestamp", "observed", "forecast", "lower", "upper", "method"}
    assert all(r["lower"] <= r["forecast"] <= r["upper"] for r in rows)
    res = runner.invoke(app, ["forecast", "--csv", str(step_csv), "--method", "ma5"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0].split("\t") == ["timestamp", "observed", "forecast", "lower", "upper", "method"]
    assert lines[1].endswith("\tma5") and len(lines) == 136


def test_changes_offline_and_online(step_csv: Path) -> None:
    res = runner.invoke(app, ["changes", "--csv", str(step_csv), "--json"])
    assert res.exit_code == 0, res.output
    (cp,) = json.loads(res.stdout)
    assert abs(cp["index"] - 80) <= 1 and cp["change_percent"] == pytest.approx(-40, abs=2)
    assert cp["before"] == pytest.approx(500, abs=3) and cp["direction"] == "down"
    res = runner.invoke(app, ["changes", "--csv", str(step_csv), "--online", "--json"])
    (alert,) = json.loads(res.stdout)
    assert 80 <= alert["alert_index"] <= 83
    res = runner.invoke(app, ["changes", "--csv", str(step_csv), "--online"])
    assert res.stdout.splitlines()[0].endswith("alert_index\talert_timestamp")


def test_diurnal_json(step_csv: Path) -> None:
    res = runner.invoke(app, ["diurnal", "--csv", str(step_csv), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"weekdays", "weekends"}
    assert {"a", "b", "c", "delta_b", "diurnal"} <= set(out["weekdays"])


@pytest.mark.parametrize("command", ["forecast", "changes", "diurnal"])
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no data rows"),
        ("2023-01-01 00:00:00,1\n", "only 1 data row"),
        ("2023-01-01 00:00:00,1\n2023-01-01 01:00:00,x\n", ":2: value 'x' is not a number"),
        ("2023-01-01 00:00:00,0\n2023-01-01 01:00:00,0\n", "every value is zero"),
    ],
)
def test_bad_input_exit_2_without_traceback(
    tmp_path: Path, command: str, text: str, message: str
) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    res = runner.invoke(app, [command, "--csv", str(p), "--json"])
    assert res.exit_code == 2
    assert message in res.stderr and "Traceback" not in res.output
    assert res.stdout == ""


def test_unknown_method_and_missing_file(tmp_path: Path, step_csv: Path) -> None:
    res = runner.invoke(app, ["forecast", "--csv", str(step_csv), "--method", "oracle"])
    assert res.exit_code == 2 and "unknown method 'oracle'" in res.stderr
    res = runner.invoke(app, ["changes", "--csv", str(tmp_path / "none.csv")])
    assert res.exit_code == 2 and "cannot read" in res.stderr
