"""ICMP echo round-trip time and loss with iputils ``ping``.

Figures and where they come from (``rtt_source`` in the data says which was used):

* With the statistics block present and ``discard_first == 0``, counts and ``rtt_*`` are ping's
  own summary. Note that ping's summary RTT figures include duplicate replies, while
  ``rtts_ms`` never does.
* Otherwise (``discard_first > 0``, or the run was killed before the summary) ``rtt_*`` are
  computed from the per-packet lines (duplicates excluded): min, mean, max and the population
  standard deviation, which is what ping calls ``mdev``; rounded to the microsecond.
* Without a summary (killed mid-run) ``packets_sent`` is the highest sequence number seen in
  any line (reply, ``-O`` "no answer yet", ICMP error): ping sends in sequence order, so that
  many were certainly sent, and packets possibly still in flight are not counted as lost.
* ``discard_first = N`` drops the first N packets *sent* (icmp_seq 1..N), like RTPL's warm-up
  ping: they leave ``packets_sent``, ``packets_received``, loss and ``rtt_*``; their RTTs are in
  ``discarded_rtts_ms``. ``duplicates``, ``corrupted`` and ``errors`` stay whole-run counts.

Other data keys: ``destination_name``/``destination_address`` (from the header, as ping resolved
it), ``rtts_ms`` with ``seqs`` (the icmp_seq of each, unwrapped past 65535), ``lost_seq_ranges``
(inclusive ``[first, last]`` runs of packets with no parsable reply), ``ttl`` (most common),
``icmp_errors`` (``{"from", "message", "count"}``), ``tool_errors`` (ping's own stderr
complaints), ``unparsed_lines``, ``truncated`` (no statistics block) and ``elapsed_ms``.

By default ping sends exactly ``count`` requests (``-c``) and then waits for the replies still
in flight (up to two RTTs, or ``-W 5`` s when nothing came back), so ``packets_sent == count``
and a long path's last replies are not mistaken for loss. With an explicit ``deadline`` ping runs
with ``-w``, and iputils then keeps sending until ``count`` *replies* have arrived or the
deadline passes (it stops at the first ICMP error): ``packets_sent`` may exceed ``count``, and
requests sent in the last RTT before the stop count as lost. Loss is always received/sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import sys
import time
from asyncio import FIRST_COMPLETED
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, NoReturn

from pydantic import Field, model_validator

from iepm.errors import ParseError, ToolFailed, ToolNotFound
from iepm.probes.base import (
    Column,
    Health,
    Metric,
    ProbeContext,
    ProbeMeta,
    ProbeSpec,
    execute,
    failed_result,
    figure,
    result_from_raw,
)
from iepm.results import Result, utcnow
from iepm.runner import RawRun, Supervised, start_process, tool_version

NAME = "ping"
TOOL = "ping"
META = ProbeMeta(scheduling="background", version_argv=("ping", "-V"), gates=True, default=True)

# Alert floors keep alerts meaningful to people: a change of >= 5% and >= 0.5 ms of the RTT,
# >= 2 percentage points of loss (relative: half the old level).
METRICS: tuple[Metric, ...] = (
    Metric(NAME, "rtt_min_ms", "RTT min (ms)", "lower", 1e-3, "seconds", rollup=True),
    Metric(
        NAME,
        "rtt_avg_ms",
        "RTT avg (ms)",
        "lower",
        1e-3,
        "seconds",
        rollup=True,
        alert={"min_relative": 0.05, "min_absolute": 0.5},
        headline=True,
        # A path 20 % (50 %) and 2 ms above its lowest RTT queues or took a longer route.
        health=Health("over_baseline", 20.0, 50.0, floor=2.0),
    ),
    Metric(NAME, "rtt_max_ms", "RTT max (ms)", "lower", 1e-3, "seconds", rollup=True),
    Metric(NAME, "rtt_mdev_ms", "RTT mdev (ms)", "lower", 1e-3, "seconds"),
    Metric(
        NAME,
        "loss_percent",
        "loss (%)",
        "lower",
        1e-2,
        "ratio",
        rollup=True,
        alert={"min_relative": 0.5, "min_absolute": 2.0},
        headline=True,
        failed_runs=True,  # no reply at all is a sample of 100% loss
        down_value=100.0,
        health=Health("value", 0.1, 1.0),  # MaDDash's and perfSONAR's loss thresholds
    ),
)

COLUMNS = [
    Column("packets_sent", "echo requests sent (after discard_first)"),
    Column("packets_received", "distinct echo replies received (after discard_first)"),
    Column("duplicates", "duplicate replies, whole run"),
    Column("errors", "ICMP error or local send errors, whole run"),
    Column("loss_percent", "100 * (sent - received) / sent"),
    Column("rtt_min_ms", "minimum round-trip time"),
    Column("rtt_avg_ms", "mean round-trip time"),
    Column("rtt_max_ms", "maximum round-trip time"),
    Column("rtt_mdev_ms", "population standard deviation of the round-trip time (ping's mdev)"),
    Column("ttl", "most common TTL of the replies"),
    Column("discarded", "packets dropped from the statistics by discard_first"),
]

# Replies shorter than this carry no send timestamp, so ping prints no time= for them.
TIMESTAMP_BYTES = 16
SEQ_MODULO = 65536  # icmp_seq is 16 bits and wraps
MAX_LISTED_ERRORS = 20
# -W: how long ping waits for a reply after its last request when no reply came at all (with
# replies it waits two RTTs); this bounds a run on a dead path.
REPLY_WAIT_S = 5


class Spec(ProbeSpec):
    """Parameters of one ping run."""

    count: int = Field(10, ge=1, le=100_000, description="echo requests to send (-c)")
    interval_s: float = Field(
        1.0,
        ge=0.002,
        le=60,
        description="seconds between requests (-i)",
        json_schema_extra={"cli": "interval"},
    )
    size_bytes: int = Field(
        56,
        ge=0,
        le=65507,
        description=f"ICMP payload bytes (-s); below {TIMESTAMP_BYTES} ping cannot time replies",
        json_schema_extra={"cli": "size"},
    )
    deadline: float | None = Field(
        None,
        ge=1,
        le=3600,
        description="seconds before ping exits on its own (-w, rounded up; ping then sends "
        "until count replies arrive); default: none, ping sends count requests and waits for "
        "their replies",
    )
    discard_first: int = Field(
        0, ge=0, le=1000, description="drop the first N packets from the statistics (warm-up)"
    )
    ipv6: bool = Field(False, description="force IPv6 (-6) when the address is a host name")

    @model_validator(mode="after")
    def _discard_leaves_packets(self) -> Spec:
        if self.discard_first >= self.count:
            raise ValueError(
                f"discard_first ({self.discard_first}) must be smaller than count "
                f"({self.count}), or no packet is left to measure"
            )
        return self

    def ping_deadline_s(self) -> int | None:
        """The ``-w`` value (whole seconds, as iputils rejects fractions), if a deadline is set."""
        return None if self.deadline is None else math.ceil(self.deadline)

    def deadline_s(self) -> float:
        # ping stops on its own (after count requests and their replies, or at -w); the runner
        # kills it only if that somehow fails.
        own = self.ping_deadline_s()
        if own is None:
            own = math.ceil(self.count * self.interval_s + REPLY_WAIT_S)
        return float(own + 5)


def build_argv(spec: Spec, address: str) -> list[str]:
    argv = ["ping", "-n", "-O"]  # -O: lost packets show up as lines, even if ping is killed
    if spec.ipv6:
        argv.append("-6")
    argv += [
        "-c",
        str(spec.count),
        "-i",
        f"{spec.interval_s:g}",
        "-s",
        str(spec.size_bytes),
    ]
    own_deadline = spec.ping_deadline_s()
    if own_deadline is None:
        argv += ["-W", str(REPLY_WAIT_S)]
    else:
        argv += ["-w", str(own_deadline)]
    argv += ["--", address]  # "--": an address can never be taken for an option
    return argv


# --- parsing ---------------------------------------------------------------------------------

_TIMESTAMP_RE = re.compile(r"^\[\d+(?:\.\d+)?\]\s*")
# The header is "PING <head>[ from <source> [<device>]:] <size>[(<total>)] bytes of data." or,
# for IPv6, "... data bytes". Matched from its tail so no pattern backtracks over the head.
_HEADER_TAIL_RE = re.compile(r" \d+(?:\(\d+\))? (?:bytes of data\.?|data bytes)$")
_REPLY_RE = re.compile(
    r"^(?P<bytes>\d+) bytes from (?P<src>.+?): icmp_seq=(?P<seq>\d+)(?: ident=\d+)?"
    r"(?: ttl=(?P<ttl>\d+))?(?: time[=<](?P<time>\d+(?:\.\d+)?) ms)?(?P<rest>.*)$"
)
_NO_ANSWER_RE = re.compile(r"^no answer yet for icmp_seq=(?P<seq>\d+)\s*$")
_ICMP_ERROR_RE = re.compile(
    r"^From (?P<src>\S+?)(?: \((?P<addr>[^()]*)\))?:? (?:icmp_seq=(?P<seq>\d+) )?(?P<msg>.*)$"
)
_STATS_TITLE_RE = re.compile(r"^--- (?P<name>.*) ping statistics ---\s*$")
_TRANSMITTED_RE = re.compile(
    r"^(?P<sent>\d+) packets transmitted, (?P<received>\d+) (?:packets )?received(?P<rest>.*)$"
)
_RTT_RE = re.compile(
    r"^(?:rtt|round-trip) min/avg/max(?:/(?:mdev|stddev))? = (?P<min>\d+(?:\.\d+)?)/"
    r"(?P<avg>\d+(?:\.\d+)?)/(?P<max>\d+(?:\.\d+)?)(?:/(?P<mdev>\d+(?:\.\d+)?))? ms"
)
_PIPE_RE = re.compile(r"^pipe \d+\s*$")
_INFO_RE = re.compile(r"^(?:PATTERN: |WARNING: )")
# iputils names itself by argv[0], and the runner executes the resolved path: "/usr/bin/ping: …".
_PROG = r"(?:\S*/)?ping6?: "
_TOOL_MESSAGE_RE = re.compile(rf"^{_PROG}(?P<msg>.+)$")  # matched against stripped lines
_RESOLVE_RE = re.compile(
    rf"^{_PROG}(?P<name>.*): (?P<why>Name or service not known|Temporary failure in name "
    r"resolution|No address associated with hostname|Name has no usable address|"
    r"Address family for hostname not supported|Non-recoverable failure in name resolution)$"
    rf"|^{_PROG}unknown host (?P<name2>.*)$"
)


def _address_in(text: str) -> str:
    """``name (addr)`` → addr; ``www(name (addr))`` → addr; a bare address → itself."""
    inner = re.findall(r"\(([^()]*)\)", text)
    return inner[-1].strip() if inner else text.strip()


def _unwrap(raw_seq: int, top: int | None) -> int:
    """Map a 16-bit icmp_seq onto the run's sequence, nearest to the highest seen so far."""
    if top is None:
        return raw_seq
    base = top - top % SEQ_MODULO
    candidates = [c for c in (base - SEQ_MODULO + raw_seq, base + raw_seq) if c >= 0]
    candidates.append(base + SEQ_MODULO + raw_seq)
    return min(candidates, key=lambda c: abs(c - top))


def _gaps(first: int, last: int, have: Iterable[int]) -> list[list[int]]:
    """Inclusive [start, end] ranges of first..last missing from ``have``."""
    ranges: list[list[int]] = []
    expected = first
    for seq in sorted(s for s in set(have) if first <= s <= last):
        if seq > expected:
            ranges.append([expected, seq - 1])
        expected = seq + 1
    if expected <= last:
        ranges.append([expected, last])
    return ranges


def _stats(rtts: list[float]) -> tuple[float, float, float, float] | None:
    """min, mean, max and population standard deviation (ping's mdev), to the microsecond."""
    if not rtts:
        return None
    mean = math.fsum(rtts) / len(rtts)
    variance = max(math.fsum((r - mean) ** 2 for r in rtts) / len(rtts), 0.0)
    return (
        round(min(rtts), 3),
        round(mean, 3),
        round(max(rtts), 3),
        round(math.sqrt(variance), 3),
    )


def _target_of(raw: RawRun) -> str:
    return raw.argv[-1] if raw.argv else "the target"


def _fail_without_output(raw: RawRun) -> NoReturn:
    """No ping output at all: turn ping's own complaint into an error a person can act on."""
    target = _target_of(raw)
    lines = [ln.strip() for ln in (raw.stderr + "\n" + raw.stdout).splitlines() if ln.strip()]
    for line in lines:
        m = _RESOLVE_RE.match(line)
        if m:
            name = m.group("name") if m.group("name") is not None else m.group("name2")
            why = m.group("why") or "unknown host"
            raise ToolFailed(
                f"the name '{name}' could not be resolved ({why}): check the target's host "
                f"name or address in the configuration, and the monitor's DNS (/etc/resolv.conf)"
            )
    for line in lines:
        m = _TOOL_MESSAGE_RE.match(line)
        if not m:
            continue
        msg = m.group("msg")
        hint = ""
        if "Network is unreachable" in msg:
            hint = f" — the monitor has no route to {target}: check its routes and interfaces"
        elif "Operation not permitted" in msg or "Permission denied" in msg:
            hint = (
                " — ping lacks privileges: give it CAP_NET_RAW or widen net.ipv4.ping_group_range"
            )
        elif "invalid" in msg or "usage" in msg or "option" in msg:
            hint = " — ping rejected iepm's arguments: unsupported ping version? (report it)"
        raise ToolFailed(f"ping to {target} failed before sending anything: {msg}{hint}")
    if not lines:
        raise ParseError(
            f"ping to {target} printed nothing (exit {raw.returncode}): expected a 'PING' "
            "header, reply lines and a statistics block"
        )
    raise ParseError(
        f"not ping output: no 'PING' header, reply line or statistics summary found "
        f"(first line: {lines[0][:120]!r})"
    )


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    """Read iputils ping output (any flags, ping or ping6) into the probe's data dict.

    Of the spec only ``discard_first`` changes the reading (see the module docstring). Raises
    ToolFailed when ping could not start (unknown host, no route, no privileges) and ParseError
    when the text is not ping output.
    """
    discard_first = spec.discard_first if spec is not None else 0
    dest_name: str | None = None
    dest_address: str | None = None
    seen_header = False
    # Per distinct sequence number: rtt (None when ping printed no time) and ttl.
    replies: dict[int, tuple[float | None, int | None]] = {}
    order: list[int] = []  # sequence numbers of first replies, in arrival order
    dup_lines = 0
    corrupted_lines = 0
    error_lines: Counter[tuple[str, str]] = Counter()
    top: int | None = None  # highest sequence number seen in any line
    unparsed = 0
    summary: dict[str, int | float] | None = None
    rtt_summary: tuple[float, float, float, float | None] | None = None
    elapsed_ms: int | None = None

    lows: list[int] = []  # the lowest sequence number seen, once known

    def see(raw_seq: int) -> int:
        nonlocal top
        seq = _unwrap(raw_seq, top)
        top = seq if top is None else max(top, seq)
        if not lows or seq < lows[0]:
            lows[:] = [seq]
        return seq

    for raw_line in raw.stdout.splitlines():
        line = _TIMESTAMP_RE.sub("", raw_line.strip(), count=1)
        if not line or _INFO_RE.match(line) or _PIPE_RE.match(line):
            continue
        if m := _REPLY_RE.match(line):
            raw_seq = int(m.group("seq"))
            if raw_seq >= SEQ_MODULO:
                unparsed += 1
                continue
            seq = see(raw_seq)
            rest = m.group("rest")
            if "(BAD CHECKSUM!)" in rest:
                corrupted_lines += 1
                continue
            if "(DUP!)" in rest or seq in replies:
                dup_lines += 1
                continue
            time_text = m.group("time")
            ttl_text = m.group("ttl")
            replies[seq] = (
                float(time_text) if time_text is not None else None,
                int(ttl_text) if ttl_text is not None else None,
            )
            order.append(seq)
        elif m := _NO_ANSWER_RE.match(line):
            if int(m.group("seq")) < SEQ_MODULO:
                see(int(m.group("seq")))
            else:
                unparsed += 1
        elif line.startswith("PING ") and (m := _HEADER_TAIL_RE.search(line)):
            seen_header = True
            head = line[len("PING ") : m.start()]
            head = head.split(" from ", 1)[0]  # names and addresses hold no spaces
            dest_name = head.split("(", 1)[0].strip() or None
            dest_address = _address_in(head) or None
        elif m := _STATS_TITLE_RE.match(line):
            dest_name = dest_name or (m.group("name").strip() or None)
        elif m := _TRANSMITTED_RE.match(line):
            rest = m.group("rest")
            summary = {"sent": int(m.group("sent")), "received": int(m.group("received"))}
            for key, pattern in (
                ("duplicates", r"\+(\d+) duplicates"),
                ("corrupted", r"\+(\d+) corrupted"),
                ("errors", r"\+(\d+) errors"),
            ):
                found = re.search(pattern, rest)
                summary[key] = int(found.group(1)) if found else 0
            found = re.search(r"time (\d+)\s*ms", rest)
            elapsed_ms = int(found.group(1)) if found else None
        elif m := _RTT_RE.match(line):
            mdev = m.group("mdev")
            rtt_summary = (
                float(m.group("min")),
                float(m.group("avg")),
                float(m.group("max")),
                float(mdev) if mdev is not None else None,
            )
        elif m := _ICMP_ERROR_RE.match(line):
            if m.group("seq") is not None and int(m.group("seq")) < SEQ_MODULO:
                see(int(m.group("seq")))
            source = m.group("addr") or m.group("src")
            error_lines[(source, m.group("msg") or "ICMP error")] += 1
        else:
            unparsed += 1

    if not seen_header and summary is None and not replies and top is None:
        _fail_without_output(raw)

    tool_errors: list[str] = []
    for line in raw.stderr.splitlines():
        m = _TOOL_MESSAGE_RE.match(line.strip())
        if m and m.group("msg") not in tool_errors and len(tool_errors) < MAX_LISTED_ERRORS:
            tool_errors.append(m.group("msg"))

    truncated = summary is None
    # A window of a long-lived ping (continuous mode) starts mid-run, with no header and no
    # summary: its packets are those from the lowest sequence number it mentions.
    low = min(lows) if lows and summary is None and not seen_header else 1
    if summary is not None:
        sent = int(summary["sent"])
        received = int(summary["received"])
        duplicates = int(summary["duplicates"])
        corrupted = int(summary["corrupted"])
        errors = int(summary["errors"])
    else:
        sent = (top or 0) - low + 1 if top is not None else 0
        received = len(replies)
        duplicates = dup_lines
        corrupted = corrupted_lines
        errors = sum(error_lines.values())

    first_seq = low
    discarded = min(discard_first, sent)
    kept = [s for s in order if s >= first_seq + discarded]
    gone = [s for s in order if s < first_seq + discarded]
    if discarded:
        sent -= discarded
        received = max(0, received - len(gone))

    rtts = [r for s in kept if (r := replies[s][0]) is not None]
    seqs = [s for s in kept if replies[s][0] is not None]
    if rtt_summary is not None and not discarded:
        rtt_min, rtt_avg, rtt_max, rtt_mdev = rtt_summary
        rtt_source: str | None = "summary"
    elif computed := _stats(rtts):
        rtt_min, rtt_avg, rtt_max, rtt_mdev = computed
        rtt_source = "replies"
    else:
        rtt_min = rtt_avg = rtt_max = rtt_mdev = None
        rtt_source = None

    ttls = Counter(t for s in kept if (t := replies[s][1]) is not None)
    last_seq = first_seq - 1 + discarded + sent
    return {
        "destination_name": dest_name,
        "destination_address": dest_address,
        "packets_sent": sent,
        "packets_received": received,
        "duplicates": duplicates,
        "corrupted": corrupted,
        "errors": errors,
        "loss_percent": 100.0 * (sent - received) / sent if sent > 0 else None,
        "rtt_min_ms": rtt_min,
        "rtt_avg_ms": rtt_avg,
        "rtt_max_ms": rtt_max,
        "rtt_mdev_ms": rtt_mdev,
        "rtt_source": rtt_source,
        "ttl": ttls.most_common(1)[0][0] if ttls else None,
        "discarded": discarded,
        "discarded_rtts_ms": [r for s in gone if (r := replies[s][0]) is not None],
        "rtts_ms": rtts,
        "seqs": seqs,
        "lost_seq_ranges": _gaps(first_seq + discarded, last_seq, kept) if sent > 0 else [],
        "icmp_errors": [
            {"from": source, "message": msg, "count": n}
            for (source, msg), n in error_lines.most_common(MAX_LISTED_ERRORS)
        ],
        "tool_errors": tool_errors,
        "unparsed_lines": unparsed,
        "truncated": truncated,
        "elapsed_ms": elapsed_ms,
    }


# --- judging ---------------------------------------------------------------------------------

_HOST_DOWN = "the last router gets no answer from the host: it is down or the address is wrong"
_NO_ROUTE = "a router has no route to the target: check routing"
_TOO_BIG = "the path MTU is below the packet size: lower size_bytes"
_FILTERED = (
    "a firewall rejects ICMP to the target: set ping_expected=false for this target if it "
    "never answers ping"
)
# Substrings of iputils' ICMP error texts (ping and ping6), and what they mean for the user.
_ICMP_HINTS = (
    ("Host Unreachable", _HOST_DOWN),
    ("Address unreachable", _HOST_DOWN),
    ("Net Unreachable", _NO_ROUTE),
    ("No route", _NO_ROUTE),
    ("Time to live exceeded", "a routing loop, or the path is longer than the TTL"),
    ("Frag needed", _TOO_BIG),
    ("Packet too big", _TOO_BIG),
    ("message too long", _TOO_BIG),
    ("prohibited", _FILTERED),
    ("Packet filtered", _FILTERED),
)


def _hint_for(message: str) -> str:
    for needle, hint in _ICMP_HINTS:
        if needle.lower() in message.lower():
            return hint
    return "check the path to the target"


def check(data: dict[str, Any], spec: Spec) -> str | None:
    """Why a parsed ping run is still a failure: no reply at all. Partial loss is data."""
    target = data.get("destination_address") or data.get("destination_name") or "the target"
    sent = data.get("packets_sent") or 0
    received = data.get("packets_received") or 0
    if sent == 0:
        if data.get("truncated"):
            return (
                f"ping to {target} ended before reporting any packet: it was stopped right "
                "after starting (raise deadline, or check the monitor's load)"
            )
        return f"ping to {target} sent no packets" + (
            f": {data['tool_errors'][0]}" if data.get("tool_errors") else ""
        )
    if received > 0:
        return None
    head = f"no reply from {target}: {sent} sent, 0 received (100% loss)"
    icmp_errors = data.get("icmp_errors") or []
    if icmp_errors:
        first = icmp_errors[0]
        return (
            f"{head}, {data.get('errors', 0)} errors — {first['from']} reports "
            f"'{first['message']}': {_hint_for(first['message'])}"
        )
    if data.get("tool_errors"):
        message = data["tool_errors"][0]
        return f"{head} — ping reports '{message}' locally: {_hint_for(message)}"
    return (
        f"{head} — host down, or ICMP filtered; set ping_expected=false for this target if "
        "it never answers ping"
    )


def summary(data: dict[str, Any]) -> str:
    d = data
    return (
        f"rtt min/avg/max {figure(d.get('rtt_min_ms'))}/{figure(d.get('rtt_avg_ms'))}/"
        f"{figure(d.get('rtt_max_ms'))} ms, loss {figure(d.get('loss_percent'))}% "
        f"({d.get('packets_received', '-')}/{d.get('packets_sent', '-')})"
    )


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    return await execute(sys.modules[__name__], spec, ctx)


# --- continuous mode ---------------------------------------------------------------------------
#
# One long-lived ``ping -D -O -i INTERVAL`` per target: each reply (and each "no answer yet", a
# loss) is handed on as it comes, and every ``window_s`` of sequence numbers becomes one stored
# result carrying that window's per-packet RTTs — one archive row a minute per target, however
# long the monitor runs. A process lives at most STREAM_SEGMENT_S (its own ``-w``), then a fresh
# one starts; the runner's supervisor kills it by process group at its deadline or on stop.

STREAM_SEGMENT_S = 3600
# No line at all for this long (ping prints one per interval with -O): ping is stuck; restart.
STREAM_SILENCE_S = 30.0
# A window closes once ping has sent this many packets past its end: a reply later than that
# (an RTT over CLOSE_AFTER intervals) is counted lost, as ping's "no answer yet" already said.
CLOSE_AFTER = 5
# After a ping process ended (or failed to start), wait this long before the next one.
RESTART_WAIT_S = 5.0
STDERR_KEEP_BYTES = 4096

_STREAM_TS_RE = re.compile(r"^\[(?P<t>\d+(?:\.\d+)?)\]\s*(?P<rest>.*)$")


class StreamLine(NamedTuple):
    """One line of ``ping -D -O`` output as the live view needs it: ``rtt_ms`` None with a
    ``seq`` is a loss ("no answer yet" or an ICMP error); ``seq`` None is any other line."""

    t_s: float | None
    seq: int | None
    rtt_ms: float | None


def stream_line(line: str) -> StreamLine:
    """Read one output line of a continuous ping (pure)."""
    text = line.strip()
    t_s: float | None = None
    if m := _STREAM_TS_RE.match(text):
        t_s, text = float(m.group("t")), m.group("rest")
    if m := _REPLY_RE.match(text):
        rest = m.group("rest")
        if "(DUP!)" in rest or "(BAD CHECKSUM!)" in rest:
            return StreamLine(t_s, None, None)
        time_text = m.group("time")
        return StreamLine(t_s, int(m.group("seq")), float(time_text) if time_text else None)
    if m := _NO_ANSWER_RE.match(text):
        return StreamLine(t_s, int(m.group("seq")), None)
    if (m := _ICMP_ERROR_RE.match(text)) and m.group("seq") is not None:
        return StreamLine(t_s, int(m.group("seq")), None)
    return StreamLine(t_s, None, None)


def stream_argv(spec: Spec, address: str) -> list[str]:
    """The long-lived ping of continuous mode (``-w``: it ends on its own after a segment)."""
    # Sequence numbers stay below 65536 within a segment (no wrap to unwrap across windows).
    segment_s = max(1, min(STREAM_SEGMENT_S, int(60_000 * spec.interval_s)))
    argv = ["ping", "-n", "-O", "-D"] + (["-6"] if spec.ipv6 else [])
    argv += ["-i", f"{spec.interval_s:g}", "-s", str(spec.size_bytes), "-w", str(segment_s)]
    return [*argv, "--", address]


@dataclass
class _Window:
    first_seq: int
    last_seq: int
    started_at: datetime
    t0: float
    lines: list[str] = field(default_factory=list)


class Stream:
    """A continuous ping to one target. ``on_sample(t_s, rtt_ms | None)`` sees each reply or
    loss as it comes; ``on_result(result)`` (awaited) each window's stored result."""

    def __init__(
        self,
        spec: Spec,
        ctx: ProbeContext,
        *,
        window_s: float,
        on_sample: Callable[[float, float | None], None],
        on_result: Callable[[Result], Awaitable[object]],
    ) -> None:
        # Every window is read from its own first packet: a warm-up discard applies to a run,
        # not to each minute of a stream.
        self.spec = spec.model_copy(update={"discard_first": 0})
        self.ctx = ctx
        self.packets_per_window = max(1, round(window_s / spec.interval_s))
        self.on_sample = on_sample
        self.on_result = on_result
        self.late_lines = 0  # lines about a window already stored (RTT past CLOSE_AFTER)
        self.processes = 0
        self.packets = 0  # lines about a packet (reply or loss) read so far
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """End the stream: the running ping is stopped and its open window stored."""
        self._stop.set()

    async def run(self) -> None:
        module = sys.modules[__name__]
        version = await tool_version(self.ctx.wrap(META.version_argv or ()))
        while not self._stop.is_set():
            t0 = time.monotonic()
            packets = self.packets
            try:
                await self._segment(module, version)
            except ToolNotFound as exc:
                await self.on_result(failed_result(module, self.spec, self.ctx, str(exc)))
            # A ping that could not send (unknown host, no route) is retried once a window, so
            # a dead target gives one failed result a window, as a live one gives one result.
            sent = self.packets > packets
            wait_s = RESTART_WAIT_S if sent else max(RESTART_WAIT_S, self._window_s())
            if time.monotonic() - t0 < wait_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait_s)

    def _window_s(self) -> float:
        return self.packets_per_window * self.spec.interval_s

    async def _segment(self, module: Any, version: str | None) -> int:
        """One ping process, start to end; returns how many results it stored."""
        argv = self.ctx.wrap(stream_argv(self.spec, self.ctx.address))
        segment_s = float(argv[argv.index("-w") + 1])
        tool = await start_process(argv)
        self.processes += 1
        stderr = bytearray()
        drain = asyncio.create_task(_tail(tool.process.stderr, stderr))
        n = self.packets_per_window
        header: list[str] = []
        # Open windows by index (seq 1..n is window 0): at most two, one of them waiting for
        # its last replies; windows below ``closed_below`` are stored.
        windows: dict[int, _Window] = {}
        closed_below = 0
        stored = 0
        deadline = time.monotonic() + segment_s + STREAM_SILENCE_S
        stopping = asyncio.create_task(self._stop.wait())
        try:
            assert tool.process.stdout is not None
            while True:
                reading = asyncio.create_task(tool.process.stdout.readline())
                left_s = min(STREAM_SILENCE_S, deadline - time.monotonic())
                done, _ = await asyncio.wait(
                    {reading, stopping}, timeout=max(0.0, left_s), return_when=FIRST_COMPLETED
                )
                if reading not in done:
                    reading.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reading
                    break  # stopped, silent too long, or past the segment's deadline
                raw_line = reading.result()
                if not raw_line:
                    break  # ping ended (its -w, or an error)
                text = raw_line.decode("utf-8", errors="replace").rstrip("\n")
                seen = stream_line(text)
                if seen.seq is None:
                    if not windows and closed_below == 0 and text.strip():
                        header.append(text)  # the header (and anything before a packet)
                    continue
                self.on_sample(seen.t_s or time.time(), seen.rtt_ms)
                self.packets += 1
                index = (seen.seq - 1) // n
                if index < closed_below:
                    self.late_lines += 1
                    continue
                if index not in windows:
                    windows[index] = self._open(index, header if index == 0 else [])
                windows[index].lines.append(text)
                for i in sorted(windows):
                    if windows[i].last_seq + CLOSE_AFTER < seen.seq:
                        stored += await self._store(module, version, tool, windows.pop(i), stderr)
                        closed_below = i + 1
        finally:
            stopping.cancel()
            await tool.stop()
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
        for i in sorted(windows):
            stored += await self._store(module, version, tool, windows.pop(i), stderr)
        if not stored and (header or stderr):
            # No packet at all (no route, unknown host...): the failure is data, once.
            stored += await self._store(module, version, tool, self._open(0, header), stderr)
        return stored

    def _open(self, index: int, header: list[str]) -> _Window:
        n = self.packets_per_window
        return _Window(index * n + 1, (index + 1) * n, utcnow(), time.monotonic(), list(header))

    async def _store(
        self, module: Any, version: str | None, tool: Supervised, window: _Window, err: bytearray
    ) -> int:
        raw = RawRun(
            argv=tool.argv,
            stdout="\n".join(window.lines) + ("\n" if window.lines else ""),
            stderr=err.decode("utf-8", errors="replace"),
            returncode=tool.returncode,
            started_at=window.started_at,
            duration_s=time.monotonic() - window.t0,
            pid=tool.pid,
        )
        if self.ctx.raw_log is not None:
            self.ctx.raw_log.append(
                self.ctx.target, NAME, raw, params=self.spec.model_dump(mode="json")
            )
        await self.on_result(result_from_raw(module, self.spec, self.ctx, raw, version))
        return 1


async def _tail(stream: asyncio.StreamReader | None, sink: bytearray) -> None:
    """Read a stream to its end, keeping only its last STDERR_KEEP_BYTES (bounded memory)."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.extend(chunk)
        del sink[:-STDERR_KEEP_BYTES]
