"""[schedule]: per-probe intervals; every rejection names the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from iepm.config import load_config, load_config_text
from iepm.errors import ConfigError
from iepm.probes import PROBES

SCHEDULED = """\
[monitor]
name = "mon"
cycle_interval_s = 5400

[schedule]
light_limit = 4
ping = "continuous"
traceroute = 900
iperf3 = 5400

[[targets]]
name = "cern-1"
address = "198.18.3.2"

[[targets]]
name = "fnal-1"
address = "198.18.3.3"
[targets.schedule]
traceroute = 300
"""


def error_for(text: str, tmp_path: Path) -> str:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value).replace(str(tmp_path) + "/", "")


def test_each_target_and_probe_has_its_interval() -> None:
    config = load_config_text(SCHEDULED)
    cern, fnal = config.targets
    assert config.schedule is not None and config.schedule.light_limit == 4
    assert config.every(cern, "ping") == "continuous"
    assert config.every(cern, "traceroute") == 900.0
    assert config.every(fnal, "traceroute") == 300.0  # the target's own interval wins
    assert config.every(fnal, "iperf3") == 5400.0
    assert config.every(fnal, "load") == 5400.0  # not named: the cycle interval


def test_without_schedule_the_cycle_configuration_is_unchanged() -> None:
    text = SCHEDULED.replace("[schedule]", "[defaults.iperf3]").replace("light_limit = 4\n", "")
    text = text.replace('ping = "continuous"\ntraceroute = 900\niperf3 = 5400\n', "")
    config = load_config_text(text.replace("[targets.schedule]\ntraceroute = 300\n", ""))
    assert config.schedule is None
    assert config.every(config.targets[0], "ping") == 5400.0


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("traceroute = 900", "traceroute = 0.5"),
            "targets.toml:8: schedule.traceroute: seconds between runs must be 1 to 604800 "
            "(got 0.5)",
        ),
        (
            ("iperf3 = 5400", 'iperf3 = "often"'),
            'targets.toml:9: schedule.iperf3: give seconds between runs or "continuous" '
            "(got 'often')",
        ),
        (
            ("iperf3 = 5400", 'iperf3 = "continuous"'),
            "targets.toml:9: schedule.iperf3: iperf3 has no continuous mode (give seconds)",
        ),
        (
            ("iperf3 = 5400", "pong = 60"),
            # The known probes are the registry's, whatever is registered.
            "targets.toml:9: schedule.pong: unknown probe 'pong' "
            f"(known: {', '.join(sorted(PROBES))})",
        ),
        (
            ("light_limit = 4", "light_limit = 0"),
            "targets.toml:6: schedule.light_limit: Input should be greater than or equal to 1 "
            "(got 0)",
        ),
        (
            ("traceroute = 300", "traceroute = true"),
            "targets.toml:19: targets[1].schedule.traceroute: give seconds between runs or "
            '"continuous" (got True)',
        ),
    ],
)
def test_schedule_rejections_name_file_line_and_field(
    change: tuple[str, str], expected: str, tmp_path: Path
) -> None:
    old, new = change
    assert old in SCHEDULED
    assert error_for(SCHEDULED.replace(old, new, 1), tmp_path).startswith(expected)


def test_a_target_schedule_needs_the_schedule_table(tmp_path: Path) -> None:
    text = SCHEDULED.replace("[schedule]\nlight_limit = 4\nping = \"continuous\"\n"
                             "traceroute = 900\niperf3 = 5400\n", "")  # fmt: skip
    assert error_for(text, tmp_path) == (
        "targets.toml:13: targets[1].schedule: needs a [schedule] table (per-probe intervals)"
    )
