from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from iepm.tomlpos import format_loc, key_lines, line_of

TEXT = """\
# comment
[monitor]
name = "m"

[[targets]]
name = "a"

[[targets]]
name = "b"
[targets.iperf3]
streams = 3
"a.b".c = 1
"""


def test_paths_map_to_lines() -> None:
    positions = key_lines(TEXT)
    assert positions[("monitor", "name")] == 3
    assert positions[("targets", 0, "name")] == 6
    assert positions[("targets", 1)] == 8
    assert positions[("targets", 1, "iperf3", "streams")] == 11
    assert positions[("targets", 1, "iperf3", "a.b", "c")] == 12


def test_line_of_falls_back_to_the_nearest_parent() -> None:
    assert line_of(TEXT, ("targets", 1, "iperf3", "window")) == 10
    assert line_of(TEXT, ("nothing",)) is None


def test_format_loc() -> None:
    assert format_loc(("targets", 1, "iperf3", "streams")) == "targets[1].iperf3.streams"


@given(st.text(max_size=400))
def test_never_raises_on_any_text(text: str) -> None:
    key_lines(text)
