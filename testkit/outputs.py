"""Real tool outputs, damaged: the parsers' property tests feed them to ``parse()``."""

from __future__ import annotations

from hypothesis import strategies as st


def mutate_output(
    draw: st.DataObject, text: str, insertions: st.SearchStrategy[str], characters: str
) -> str:
    """A real tool output damaged 1-6 times: a cut, an inserted fragment (``insertions``), a
    duplicated or swapped line, or one character replaced by one of ``characters``."""
    for _ in range(draw.draw(st.integers(1, 6))):
        lines = text.splitlines(keepends=True) or [""]
        op = draw.draw(st.sampled_from(["cut", "insert", "dup", "swap", "digit"]))
        i = draw.draw(st.integers(0, len(text)))
        if op == "cut":
            text = text[:i] + text[i + draw.draw(st.integers(1, 40)) :]
        elif op == "insert":
            text = text[:i] + draw.draw(st.one_of(st.text(max_size=20), insertions)) + text[i:]
        elif op == "digit":
            text = text[:i] + draw.draw(st.sampled_from(characters)) + text[i + 1 :]
        else:
            k = draw.draw(st.integers(0, len(lines) - 1))
            m = draw.draw(st.integers(0, len(lines) - 1))
            if op == "dup":
                lines.insert(k, lines[m])
            else:
                lines[k], lines[m] = lines[m], lines[k]
            text = "".join(lines)
    return text
