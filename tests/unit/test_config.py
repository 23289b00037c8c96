"""targets.toml: every rejection names the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from iepm.config import load_config, load_config_text
from iepm.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

VALID = """\
[monitor]
name = "slac-mon"
cycle_interval_s = 600

[defaults.iperf3]
duration_s = 10

[[targets]]
name = "cern-1"
address = "198.18.3.2"

[[targets]]
name = "fnal-1"
address = "fnal.example.org"
ping_expected = false
[targets.iperf3]
streams = 8
window = "1M"
"""


def test_example_config_is_valid() -> None:
    config = load_config(REPO / "examples" / "targets.toml")
    assert config.target_names() == ["cern-1", "fnal-1"]
    spec = config.spec_for(config.target("cern-1"), "iperf3")
    assert spec.streams == 4  # type: ignore[attr-defined]
    assert spec.omit_s == 2  # type: ignore[attr-defined]  # from [defaults.iperf3]


def test_target_values_override_defaults_field_by_field() -> None:
    config = load_config_text(VALID)
    fnal = config.spec_for(config.target("fnal-1"), "iperf3")
    cern = config.spec_for(config.target("cern-1"), "iperf3")
    assert (fnal.streams, fnal.duration_s) == (8, 10)  # type: ignore[attr-defined]
    assert cern.streams == 1  # type: ignore[attr-defined]


def error_for(text: str, tmp_path: Path) -> str:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value).replace(str(tmp_path) + "/", "")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("streams = 8", "streams = 500"),
            "targets.toml:17: targets[1].iperf3.streams: "
            "Input should be less than or equal to 128 (got 500)",
        ),
        (
            ('window = "1M"', 'window = "lots"'),
            "targets.toml:18: targets[1].iperf3.window:",
        ),
        (
            ("ping_expected = false", "ping_expectd = false"),
            "targets.toml:15: targets[1].ping_expectd: unknown field",
        ),
        (
            ('name = "fnal-1"', 'name = "cern-1"'),
            "targets.toml: (top level): duplicate target name 'cern-1'",
        ),
        (
            ('address = "198.18.3.2"', 'address = "not an address!"'),
            "targets.toml:10: targets[0].address: not an IP address or host name",
        ),
        (
            ("duration_s = 10", "duration_s = -3"),
            "targets.toml:6: defaults.iperf3.duration_s: "
            "Input should be greater than or equal to 1",
        ),
        (
            ("cycle_interval_s = 600", "cycle_interval_s = 17"),
            "targets.toml:8: targets[0].iperf3: iperf3 may run",
        ),
        (
            ('name = "slac-mon"', 'name = "slac-mon"\ncolour = "blue"'),
            "targets.toml:3: monitor.colour: unknown field",
        ),
    ],
)
def test_rejections_name_file_line_and_field(
    change: tuple[str, str], expected: str, tmp_path: Path
) -> None:
    old, new = change
    assert old in VALID
    message = error_for(VALID.replace(old, new, 1), tmp_path)
    assert expected in message, message


def test_unknown_probe_is_rejected(tmp_path: Path) -> None:
    text = VALID.replace('address = "198.18.3.2"', 'address = "198.18.3.2"\nprobes = ["pnig"]')
    message = error_for(text, tmp_path)
    assert "targets.toml:11: targets[0].probes: unknown probe 'pnig'" in message


def test_not_toml_says_so(tmp_path: Path) -> None:
    message = error_for("[monitor\nname = 1", tmp_path)
    assert message.startswith("targets.toml:1: not valid TOML:")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.toml")


def test_a_validator_message_reads_without_pydantic_prefix() -> None:
    """A validator's ValueError is the whole message, in a file's error and in an option's one
    line (pydantic words it "Value error, ..."; people act on the text after it)."""
    from pydantic import BaseModel, ValidationError, field_validator

    from iepm.cliglue import explain
    from iepm.errors import ExitCode

    class Shape(BaseModel):
        sides: int

        @field_validator("sides")
        @classmethod
        def _polygon(cls, v: int) -> int:
            if v < 3:
                raise ValueError("a polygon has 3 sides or more")
            return v

    with pytest.raises(ValidationError) as caught:
        Shape(sides=2)
    assert explain(caught.value) == (
        "invalid value: sides: a polygon has 3 sides or more (got 2)",
        ExitCode.USAGE,
    )
    text = "[monitor]\nname = 'a/b'\n"
    with pytest.raises(ConfigError) as error:
        load_config_text(text, Path("t.toml"))
    assert str(error.value).startswith("t.toml:2: monitor.name: monitor names are")
