"""Topology validation: every rejection names file, line and field, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from iepm.errors import ConfigError
from iepm.lab.topology import load_topology, plan, validate

EXAMPLE = Path(__file__).parents[2] / "examples" / "lab" / "wan.toml"

GOOD = """\
[lab]
name = "t"

[[hosts]]
name = "mon"
role = "monitor"

[[hosts]]
name = "r1"
role = "router"

[[hosts]]
name = "cern"
address = "198.18.0.10"

[[links]]
a = "mon"
b = "r1"
delay_ms = 5

[[links]]
a = "r1"
b = "cern"
delay_ms = 10
loss_percent = 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lab.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_topology(path)
    return str(info.value)


def test_example_file_is_valid_and_routes_through_routers() -> None:
    topo = load_topology(EXAMPLE)
    p = plan(topo)
    assert p.addresses["cern"] == "198.18.0.10"
    # the pinned route: mon -> slac_gw -> esnet -> geant -> cern
    assert p.routes["esnet"]["cern"] == "transatlantic"
    fnal_back = p.links["esnet_fnal"].ba
    assert fnal_back.rate_mbit == 20 and fnal_back.ge_p_percent == 0.5
    assert p.links["esnet_fnal"].ab.ge_p_percent is None


def test_good_file(tmp_path: Path) -> None:
    p = plan(load_topology(write(tmp_path, GOOD)))
    assert p.addresses == {"mon": "198.18.0.1", "r1": "198.18.0.2", "cern": "198.18.0.10"}
    assert p.netns("mon") == "t-mon"
    assert p.routes["mon"] == {"r1": "mon-r1", "cern": "mon-r1"}
    assert p.routes["r1"]["cern"] == "r1-cern"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('b = "cern"', 'b = "cren"', ":23: links[1].b: unknown host 'cren'"),
        ("delay_ms = 5", "delay_ms = -5", ":19: links[0].delay_ms: Input should be greater than"),
        ("loss_percent = 1", "loss_percent = 100.5", ":25: links[1].loss_percent: Input should be"),
        (
            'address = "198.18.0.10"',
            'address = "192.0.2.10"',
            ":14: hosts[2].address: 192.0.2.10 is outside the lab range 198.18.0.0/15",
        ),
        ('name = "r1"', 'name = "mon"', ":9: hosts[1].name: duplicate host name 'mon'"),
        ('name = "t"', 'name = "my-lab"', ":2: lab.name: String should match pattern"),
        ('role = "router"', 'role = "switch"', ":10: hosts[1].role: Input should be"),
    ],
)
def test_bad_input_names_file_line_and_field(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    assert old in GOOD
    message = error_of(tmp_path, GOOD.replace(old, new, 1))
    assert f"{tmp_path / 'lab.toml'}{expected}" in message


def test_duplicate_link_and_unknown_event_link(tmp_path: Path) -> None:
    text = GOOD + '\n[[links]]\nname = "mon-r1"\na = "cern"\nb = "mon"\n'
    text += '\n[[events]]\nat_s = 1\naction = "link"\nlink = "nope"\ndelay_ms = 3\n'
    message = error_of(tmp_path, text)
    assert ":28: links[2].name: duplicate link name 'mon-r1'" in message
    assert ":35: events[0].link: unknown link 'nope'" in message


def test_route_path_must_be_linked_and_transit_only_routers(tmp_path: Path) -> None:
    text = GOOD + '\n[[routes]]\npath = ["mon", "cern"]\n'
    message = error_of(tmp_path, text)
    assert ":28: routes[0].path[1]: no link between mon and cern" in message


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    assert "not valid TOML" in error_of(tmp_path, "[lab\nname=1")
    with pytest.raises(ConfigError, match="cannot read"):
        load_topology(tmp_path / "missing.toml")


def test_dict_input_and_duplicate_address() -> None:
    data = {
        "lab": {"name": "d"},
        "hosts": [
            {"name": "a", "address": "198.18.0.1"},
            {"name": "b", "address": "198.18.0.1"},
        ],
    }
    with pytest.raises(ConfigError, match=r"<dict>: hosts\[1\]\.address: address 198\.18\.0\.1"):
        validate(data, "<dict>")


def test_unknown_field_rejected(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace("delay_ms = 10", "delay_ms = 10\nbandwidth = 5"))
    assert ":25: links[1].bandwidth: Extra inputs are not permitted" in message


def test_hosts_are_not_transit() -> None:
    topo = validate(
        {
            "lab": {"name": "x"},
            "hosts": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "links": [{"a": "a", "b": "b"}, {"a": "b", "b": "c"}],
        }
    )
    routes = plan(topo).routes
    assert "c" not in routes["a"]  # b is a target, not a router
    assert routes["b"]["c"] == "b-c"
