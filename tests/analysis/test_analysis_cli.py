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
        ("timestamp,value\n", "no data rows"),
        ("2023-01-01 00:00:00,1\n2023-01-01 01:00:00,nan\n", ":2: value 'nan' is not finite"),
        ("2023-01-01 00:00:00,-inf\n2023-01-01 01:00:00,1\n", ":1: value '-inf' is not finite"),
        (
            "2023-01-01 02:00:00,1\n2023-01-01 01:00:00,2\n",
            ":2: timestamp '2023-01-01 01:00:00' is earlier than line 1",
        ),
        (
            "2023-01-01 01:00:00,1\n2023-01-01 01:00:00,2\n",
            ":2: timestamp '2023-01-01 01:00:00' repeats the timestamp of line 1",
        ),
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


def test_forecast_needs_six_rows_and_says_so(tmp_path: Path) -> None:
    p = tmp_path / "short.csv"
    p.write_text(
        "".join(f"{iso(t)},{v}\n" for t, v in zip(hourly(5), [1, 2, 3, 4, 5], strict=True))
    )
    res = runner.invoke(app, ["forecast", "--csv", str(p)])
    assert res.exit_code == 2 and "only 5 data row(s); at least 6 are needed" in res.stderr
    # Changes and diurnal work on any length: a short series simply shows no change / no fit.
    res = runner.invoke(app, ["changes", "--csv", str(p), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    res = runner.invoke(app, ["diurnal", "--csv", str(p), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["weekdays"]["diurnal"] is False


@pytest.mark.parametrize("command", ["forecast", "changes", "diurnal"])
def test_extreme_values_give_results_not_warnings(tmp_path: Path, command: str) -> None:
    values = [-1.0, 1e308, -1e308, 0.0, 0.0, 3.0, 1e-300, 5.0]
    p = tmp_path / "wild.csv"
    p.write_text("".join(f"{iso(t)},{v!r}\n" for t, v in zip(hourly(8), values, strict=True)))
    res = runner.invoke(app, [command, "--csv", str(p), "--json"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    json.loads(res.stdout)
