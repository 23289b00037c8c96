"""Where the suite's time went, read from the JUnit XML files of one `make test`.

``python -m testkit.report FILE.xml...`` prints the slowest tests, the time per directory and per
tier (the ``tier`` property ``tests/conftest.py`` records on every test), and a closing line
``tests: N passed, N failed, N skipped`` over all the files. It exits 1 when a file is missing or
unreadable (a pytest run that died before writing it), so the caller's status stays honest.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

FAST_LIMIT_S = 3.0


@dataclass(frozen=True)
class Case:
    nodeid: str
    seconds: float
    outcome: str  # passed | failed | skipped
    tier: str
    reason: str = ""  # why it was skipped


def _nodeid(case: ET.Element) -> str:
    # JUnit's classname is the dotted module path plus any class: tests.web.test_api.TestX.
    parts = [part for part in (case.get("classname") or "").split(".") if part]
    name = case.get("name") or "?"
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if path.exists() or cut == 1:
            return "::".join([str(path), *parts[cut:], name])
    return name


def read_cases(path: Path) -> list[Case]:
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        reason = ""
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif (skip := case.find("skipped")) is not None:
            outcome = "skipped"
            reason = (skip.get("message") or "").strip()
        else:
            outcome = "passed"
        tier = next(
            (p.get("value") or "" for p in case.iter("property") if p.get("name") == "tier"),
            "?",
        )
        cases.append(Case(_nodeid(case), float(case.get("time") or 0.0), outcome, tier, reason))
    return cases


def wall_seconds(path: Path) -> float:
    """The run's own wall time (the test suite's ``time``: parallel workers overlap in it)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return sum(float(s.get("time") or 0.0) for s in suites)


def directory_of(nodeid: str) -> str:
    path = Path(nodeid.split("::", 1)[0])
    return str(path.parent)


def report(cases: list[Case], slowest: int) -> str:
    lines = [f"== {slowest} slowest tests (s)"]
    for case in sorted(cases, key=lambda c: c.seconds, reverse=True)[:slowest]:
        lines.append(f"{case.seconds:8.1f}  {case.tier:<8} {case.nodeid}")
    for title, key in (("directory", directory_of), ("tier", lambda n: "")):
        totals: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for case in cases:
            group = key(case.nodeid) or case.tier
            totals[group] += case.seconds
            counts[group] += 1
        lines.append(f"== test time per {title} (s, summed over parallel workers)")
        for group, seconds in sorted(totals.items(), key=lambda kv: kv[1], reverse=True):
            lines.append(f"{seconds:8.1f}  {counts[group]:5d} tests  {group}")
    # A fast-tier test that takes seconds is in the wrong tier: `make test-fast` must stay quick.
    slow_fast = [c for c in cases if c.tier == "fast" and c.seconds > FAST_LIMIT_S]
    if slow_fast:
        lines.append(f"== fast-tier tests over {FAST_LIMIT_S:g} s (mark them servers or lab)")
        lines += [f"{c.seconds:8.1f}  {c.nodeid}" for c in slow_fast]
    skipped_cases = [c for c in cases if c.outcome == "skipped"]
    if skipped_cases:
        lines.append("== skipped tests (why)")
        lines += [f"  {c.nodeid}: {c.reason[:300]}" for c in skipped_cases]
    outcomes = {name: sum(c.outcome == name for c in cases) for name in ("passed", "failed")}
    skipped = sum(c.outcome == "skipped" for c in cases)
    lines.append(
        f"tests: {outcomes['passed']} passed, {outcomes['failed']} failed, {skipped} skipped"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args(argv)
    cases: list[Case] = []
    status = 0
    walls = []
    for path in args.files:
        try:
            cases += read_cases(path)
            walls.append(f"{path.name} {wall_seconds(path):.0f} s")
        except (OSError, ET.ParseError) as exc:
            print(f"{path}: no test report ({exc})", file=sys.stderr)
            status = 1
    if walls:
        print("== wall time per run: " + ", ".join(walls))
    print(report(cases, args.slowest))
    return status


if __name__ == "__main__":
    sys.exit(main())
