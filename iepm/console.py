"""Readable terminal output: one-line summaries and the live cycle table."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from iepm.probes import PROBES
from iepm.results import Outcome, Result

OUTCOME_STYLE = {
    Outcome.OK: "green",
    Outcome.FAILED: "red",
    Outcome.TIMEOUT: "magenta",
    Outcome.SKIPPED: "yellow",
}


def summary(result: Result) -> str:
    """The figures a person looks at first: the probe's own one-line summary."""
    d = result.data
    if not result.succeeded and not d:
        return result.error or result.outcome.value
    probe = PROBES.get(result.probe)
    if probe is not None:
        return probe.summary(d)
    # A result of a probe this monitor does not know (an archive from elsewhere).
    return ", ".join(f"{k}={v}" for k, v in d.items() if not isinstance(v, list | dict))


def describe(result: Result) -> Text:
    """A multi-line readable report of one result, for ``iepm probe``."""
    style = OUTCOME_STYLE[result.outcome]
    text = Text()
    text.append(f"{result.probe} ", style="bold")
    text.append(f"{result.target} ({result.target_address}) ")
    text.append(result.outcome.value.upper(), style=f"bold {style}")
    text.append(f" in {result.duration_s:.2f} s\n")
    if result.data:
        text.append(summary(result) + "\n")
    if result.error:
        text.append(f"error: {result.error}\n", style=style)
    if not result.succeeded and result.diags:
        text.append(result.diags + "\n", style="dim")
    return text


class LiveTable:
    """Latest result per target × probe, for ``iepm run`` and ``make demo``."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.latest: dict[tuple[str, str], Result] = {}

    def update(self, result: Result) -> None:
        self.latest[(result.target, result.probe)] = result

    def render(self) -> Table:
        table = Table(title=self.title, expand=True)
        for column in ("target", "probe", "time (UTC)", "outcome", "result"):
            table.add_column(column, overflow="fold")
        for (target, probe), result in sorted(self.latest.items()):
            style = OUTCOME_STYLE[result.outcome]
            text = summary(result) if result.data else (result.error or "")
            table.add_row(
                target,
                probe,
                result.started_at.strftime("%H:%M:%S"),
                Text(result.outcome.value, style=style),
                text,
            )
        return table
