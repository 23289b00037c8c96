"""The probe contract and what is derived from it: the registry's checks, the metrics that moved
into the probes (same values as the tables they replace), the generated ``iepm probe`` commands
(every documented option spelling) and the probes' own summaries on their real outputs."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iepm.analysis.watch import AlertWatcher, alert_rules
from iepm.cli import app
from iepm.config import load_config_text
from iepm.errors import ConfigError
from iepm.probes import (
    PROBES,
    all_metrics,
    default_probes,
    gating_probes,
    load,
    metric,
    ping,
    register,
    unregister,
)
from iepm.probes.base import CONTRACT, Metric, ProbeSpec
from iepm.runner import RawRun
from iepm.store.rollup import rollup_keys

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def test_the_registry_refuses_an_incomplete_or_duplicate_probe() -> None:
    half = types.SimpleNamespace(NAME="half", TOOL="x")
    with pytest.raises(TypeError, match="lacks META, METRICS, COLUMNS, Spec, build_argv"):
        register(half)
    impostor = types.SimpleNamespace(**{name: getattr(ping, name) for name in CONTRACT})
    with pytest.raises(ValueError, match="a probe named 'ping' is already registered"):
        register(impostor)
    stray = types.SimpleNamespace(**{name: getattr(ping, name) for name in CONTRACT})
    stray.NAME = "stray"
    with pytest.raises(ValueError, match=r"declares metrics of another probe: \['ping\.rtt_min"):
        register(stray)
    mute = types.SimpleNamespace(**{name: getattr(ping, name) for name in CONTRACT})
    mute.NAME, mute.METRICS = "mute", ()

    class Spec(ProbeSpec):
        count: int = 1

    mute.Spec = Spec
    with pytest.raises(ValueError, match=r"'mute': Spec fields without a description: \['count'\]"):
        register(mute)
    assert {"half", "stray", "mute"}.isdisjoint(PROBES) and PROBES["ping"] is ping


def test_a_probe_registered_later_is_seen_by_every_helper() -> None:
    extra = types.SimpleNamespace(**{name: getattr(ping, name) for name in CONTRACT})
    extra.NAME = "ping2"
    extra.META = ping.META
    extra.METRICS = (Metric("ping2", "rtt_avg_ms", "RTT", "lower", rollup=True, alert={}),)
    register(extra)
    try:
        assert metric("ping2.rtt_avg_ms") is extra.METRICS[0]
        assert "ping2.rtt_avg_ms" in all_metrics()
        assert gating_probes() == ["ping", "ping2"] and "ping2" in default_probes()
        assert rollup_keys("ping2") == ("rtt_avg_ms",)
        assert ("ping2", "rtt_avg_ms") in {(r.probe, r.metric) for r in alert_rules()}
    finally:
        unregister("ping2")
    assert "ping2" not in PROBES and "ping2.rtt_avg_ms" not in all_metrics()
    with pytest.raises(KeyError, match=r"unknown metric 'ping2\.rtt_avg_ms'"):
        metric("ping2.rtt_avg_ms")


# The probes that existed before they described themselves; later probes' metrics are checked in
# their own tests.
ORIGINAL = ("ping", "traceroute", "iperf3", "load")


def test_the_metrics_keep_the_values_of_the_tables_they_replace() -> None:
    # web/queries.METRICS, HEADLINE, store/rollup.ROLLUP_METRICS and analysis/watch.RULES as
    # they were before the probes described themselves.
    plotted = {
        (m.name, m.label, m.better, m.to_base, m.base_unit)
        for m in all_metrics().values()
        if m.probe in ORIGINAL
    }
    assert plotted == {
        ("ping.rtt_min_ms", "RTT min (ms)", "lower", 1e-3, "seconds"),
        ("ping.rtt_avg_ms", "RTT avg (ms)", "lower", 1e-3, "seconds"),
        ("ping.rtt_max_ms", "RTT max (ms)", "lower", 1e-3, "seconds"),
        ("ping.rtt_mdev_ms", "RTT mdev (ms)", "lower", 1e-3, "seconds"),
        ("ping.loss_percent", "loss (%)", "lower", 1e-2, "ratio"),
        ("iperf3.throughput_bps", "throughput (bit/s)", "higher", 1.0, "bits_per_second"),
        ("iperf3.retransmits", "retransmits", "lower", 1.0, ""),
        ("iperf3.mean_rtt_ms", "TCP RTT (ms)", "lower", 1e-3, "seconds"),
        ("iperf3.window_bytes", "window (bytes)", "higher", 1.0, "bytes"),
        ("iperf3.stream_count", "streams", "higher", 1.0, ""),
        ("traceroute.hop_count", "hops", "lower", 1.0, ""),
    }
    assert {m.name for m in all_metrics().values() if m.headline} == {
        "iperf3.throughput_bps",
        "ping.rtt_avg_ms",
        "ping.loss_percent",
    }
    assert {p: rollup_keys(p) for p in ORIGINAL} == {
        "ping": ("rtt_min_ms", "rtt_avg_ms", "rtt_max_ms", "loss_percent"),
        "traceroute": ("hop_count",),
        "iperf3": ("throughput_bps", "retransmits"),
        "load": (),
    }
    alerting = {"threshold": 5.0, "confirm": 3}
    # In RULES' order too (readers take the first watched metric a table has).
    rules = [r for r in alert_rules() if r.probe in ORIGINAL]
    assert [(r.probe, r.metric, r.detector, r.forecast) for r in rules] == [
        ("iperf3", "throughput_bps", {"min_relative": 0.15, **alerting}, True),
        ("ping", "rtt_avg_ms", {"min_relative": 0.05, "min_absolute": 0.5, **alerting}, False),
        ("ping", "loss_percent", {"min_relative": 0.5, "min_absolute": 2.0, **alerting}, False),
    ]
    assert gating_probes() == ["ping"]
    assert default_probes() == ("ping", "traceroute", "iperf3")
    assert {n for n, p in PROBES.items() if p.META.server and n in ORIGINAL} == {"iperf3"}


def test_a_watcher_takes_the_rules_registered_when_it_starts() -> None:
    watcher = AlertWatcher(archive=None, monitor="m")  # type: ignore[arg-type]
    assert watcher.rules == alert_rules()


# README's usage lines, whose spellings the generated commands keep.
DOCUMENTED = {
    "ping": ["--count", "--interval", "--size", "--deadline", "--discard-first", "--json"],
    "traceroute": [
        "--max-hops",
        "--queries",
        "--method",
        "--wait",
        "--paris",
        "--no-paris",
        "--gap-limit",
        "--json",
    ],
    "iperf3": [
        "--port",
        "--streams",
        "--window",
        "--duration",
        "--omit",
        "--congestion",
        "--reverse",
        "--udp",
        "--rate",
        "--json",
    ],
}


@pytest.mark.parametrize("probe", sorted(DOCUMENTED))
def test_generated_commands_keep_every_documented_option(probe: str) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index(f"iepm probe {probe} TARGET")
    usage = readme[start : readme.index("\niepm ", start)]
    assert re.findall(r"--[a-z-]+", usage) == DOCUMENTED[probe]
    helped = CliRunner().invoke(app, ["probe", probe, "--help"], env={"COLUMNS": "240"})
    assert helped.exit_code == 0, helped.output
    shown = set(re.findall(r"(--[a-z0-9-]+)", helped.output))
    assert set(DOCUMENTED[probe]) <= shown, set(DOCUMENTED[probe]) - shown


def test_help_shows_each_fields_description_range_and_default() -> None:
    def helped(probe: str) -> str:
        done = CliRunner().invoke(app, ["probe", probe, "--help"], env={"COLUMNS": "240"})
        assert done.exit_code == 0, done.output
        return " ".join(done.output.split())

    pinged = helped("ping")
    assert "probe ping [OPTIONS] {target}" in pinged
    assert "--count <int> echo requests to send (-c) [1–100000; default 10]" in pinged
    assert "--interval <float> seconds between requests (-i) [0.002–60; default 1.0]" in pinged
    assert "--method <icmp|udp|tcp> probe packets" in helped("traceroute")
    assert "--reverse --no-reverse <bool> the server sends (-R)" in helped("iperf3")
    # load measures this host: no TARGET.
    assert "probe load [OPTIONS] Host load" in helped("load")


def test_an_option_out_of_range_is_refused_with_the_field_named() -> None:
    done = CliRunner().invoke(app, ["probe", "ping", "127.0.0.1", "--interval", "0.0001"])
    assert done.exit_code == 2
    # Named as typed (--interval, the Spec's interval_s), on one line: never a pydantic dump.
    assert done.stderr == (
        "error: --interval: Input should be greater than or equal to 0.002 (got 0.0001)\n"
    )


@pytest.mark.parametrize("case", ["procfs--host", "procfs--netns-reno"])
def test_the_load_summary_reads_what_the_load_probe_writes(case: str) -> None:
    recorded = json.loads((FIXTURES / "load" / f"{case}.json").read_text())
    out = (FIXTURES / "load" / f"{case}.out").read_text()
    data = load.parse(RawRun(argv=("python3",), stdout=out))
    assert data == recorded["data"]
    line = load.summary(data)
    # Before the probes owned their summaries, console.py read keys load never writes:
    # "load - - -, ...".
    figures = [f"{data[k]:.2f}" for k in ("load_avg_1m", "load_avg_5m", "load_avg_15m")]
    assert line.startswith(f"load {' '.join(figures)}, {data['cpu_count']} CPUs @ ")
    assert f"cc {data['tcp_congestion_control']}" in line and " - " not in line


TARGET = """\
[[targets]]
name = "cern-1"
address = "198.18.3.2"
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "[targets.pnig]\ncount = 3\n",
            "targets.toml:4: targets[0].pnig: [targets.pnig] is neither a target setting nor a "
            f"probe's table (probes: {', '.join(sorted(PROBES))})",
        ),
        ("ping = 3\n", "targets.toml:4: targets[0].ping: Input should be a valid dictionary"),
        (
            "[targets.probe_tables]\nping = {count = 3}\n",
            "targets.toml:4: targets[0].probe_tables: [targets.probe_tables] is neither",
        ),
        ("[targets.ping]\ncount = 0\n", "targets.toml:5: targets[0].ping.count: Input should be"),
    ],
)
def test_a_targets_tables_are_its_probes_and_nothing_else(extra: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(TARGET + extra, Path("targets.toml"))
    assert str(caught.value).startswith(expected), str(caught.value)


def test_a_probe_table_reaches_the_spec_and_is_not_shared() -> None:
    config = load_config_text(
        TARGET + "[targets.ping]\ncount = 3\n" + TARGET.replace("cern", "in2p3")
    )
    first, second = config.targets
    assert first.params("ping") == {"count": 3} and second.params("ping") == {}
    assert config.spec_for(first, "ping").count == 3  # type: ignore[attr-defined]
    assert config.spec_for(second, "ping").count == 10  # type: ignore[attr-defined]
    assert first.probes == ["ping", "traceroute", "iperf3"]
    # A copy keeps its tables (a private attribute, not a field of the file).
    assert first.model_copy().params("ping") == {"count": 3}
