from __future__ import annotations

import tomllib

from hypothesis import given
from hypothesis import strategies as st

from iepm.tomlpos import deepest_nesting, format_loc, key_lines, line_of

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


MULTILINE = """\
[[hosts]]
name = "a"
ports = [
  [1, 2],
  [3, 4],
]
after = 1
[[hosts]]
name = "b"
matrix = [
  [[1, 2]],
]
limits = { a = [
  [1],
] }
note = '''
[not.a.table]
'''
text = \"\"\"
[[nor.this]]\"\"\"
last = 1
"""


def test_a_continuation_line_of_a_multi_line_array_is_not_a_header() -> None:
    positions = key_lines(MULTILINE)
    assert positions[("hosts", 0, "ports")] == 3
    assert positions[("hosts", 0, "after")] == 7
    assert positions[("hosts", 1)] == 8
    assert positions[("hosts", 1, "name")] == 9
    assert positions[("hosts", 1, "limits")] == 13
    assert positions[("hosts", 1, "last")] == 21
    assert all(path[0] == "hosts" for path in positions), positions
    assert line_of(MULTILINE, ("hosts", 1, "matrix", 0)) == 10


def test_only_line_feeds_end_lines() -> None:
    # U+2028 and form feed are allowed in a TOML comment; they must not shift the line numbers.
    text = '# a\u2028comment\x0c\n[monitor]\nname = "m"\n'
    assert key_lines(text)[("monitor", "name")] == 3


def test_deepest_nesting() -> None:
    assert deepest_nesting(MULTILINE) == (3, 11)
    assert deepest_nesting('a = "[[[["\n') == (0, 0)
    assert deepest_nesting("x = " + "[" * 50 + "]" * 50) == (50, 1)
    deep = "x = [\n" + "[\n" * 40 + "]\n" * 41
    assert deepest_nesting(deep) == (41, 41)
    assert deepest_nesting(deep, limit=32) == (33, 33)  # the first line beyond the limit


_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
_SCALAR = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.text(alphabet="ab[]{}#'\\ ", max_size=8).map(lambda s: '"' + s.replace("\\", "") + '"'),
)
_ARRAY = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: "[\n" + ",\n".join(xs) + "\n]"),
)


@given(st.dictionaries(_NAME, _ARRAY, min_size=1, max_size=6))
def test_every_key_is_found_on_its_line_whatever_its_value_spans(values: dict[str, str]) -> None:
    text, expected, line = "[t]\n", {}, 2
    for key, value in values.items():
        expected[("t", key)] = line
        text += f"{key} = {value}\n"
        line += value.count("\n") + 1
    assert tomllib.loads(text)  # the generated text is TOML
    positions = key_lines(text)
    for path, number in expected.items():
        assert positions[path] == number
