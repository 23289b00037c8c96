"""The route to a target, hop by hop, with Linux ``traceroute`` (Dmitry Butskoy's 2.x).

Always numeric (``-n``): reverse DNS for every hop can hang far longer than the trace. The
parser still reads ``name (address)`` hops, ASN tags (``[AS123]``), MPLS extensions
(``<MPLS:L=…>``), ``F=mtu``, ``'-N'`` back-hop marks and ``!H``-style annotations, so older
logs and hand-run outputs re-extract too. ``tracepath`` output is refused with a ParseError.

``reached`` is true when the last hop printed has a response from the destination address of
the header. ``hop_count`` is that last hop's TTL (so on an unreached trace it is how far
traceroute got). ``truncated`` is a guess that the run was killed: not reached, fewer hops than
the maximum, and the last hop carries no ``!`` annotation (which would have stopped traceroute).

Each hop is ``{"ttl", "address", "hostname", "rtts_ms", "responses", "probes", "lost",
"annotations", "extensions"}``. ``address``/``hostname`` are the first responder's (None for a
silent hop); ``responses`` lists every answer in order as ``{"address", "hostname", "rtt_ms",
"annotation"}``, as one hop may be answered by several routers; ``lost`` counts the ``*``.
"""

from __future__ import annotations

import ipaddress
import math
import re
import sys
import zlib
from collections.abc import Callable
from typing import Any, Literal, NoReturn

from pydantic import Field, model_validator

from iepm.errors import ParseError, ToolFailed
from iepm.probes.base import Column, Metric, ProbeContext, ProbeMeta, ProbeSpec, execute
from iepm.results import Result
from iepm.runner import RawRun

NAME = "traceroute"
TOOL = "traceroute"
META = ProbeMeta(scheduling="background", version_argv=("traceroute", "--version"), default=True)
METRICS: tuple[Metric, ...] = (Metric(NAME, "hop_count", "hops", "lower", rollup=True),)

COLUMNS = [
    Column("reached", "the last hop answered from the destination address"),
    Column("hop_count", "TTL of the last hop printed (hops to the destination when reached)"),
    Column("destination_address", "address traced to, as traceroute resolved it"),
    Column("silent_hops", "hops where no probe was answered"),
    Column("max_hops", "the hop limit traceroute used"),
]

# traceroute 2.x keeps this many probes in flight (-N default) and waits at most -w seconds
# for each batch, so a fully silent trace takes ceil(hops * queries / 16) * wait.
SIMULTANEOUS_PROBES = 16
DEADLINE_MARGIN_S = 10.0

# What traceroute's "!" annotations mean, for error messages.
ANNOTATIONS = {
    "!H": "host unreachable",
    "!N": "network unreachable",
    "!P": "protocol unreachable",
    "!S": "source route failed",
    "!F": "fragmentation needed",
    "!X": "communication administratively prohibited",
    "!V": "host precedence violation",
    "!C": "precedence cut-off in effect",
    "!": "reply arrived with TTL <= 1",
}


class Spec(ProbeSpec):
    """Parameters of one traceroute run."""

    max_hops: int = Field(30, ge=1, le=255, description="largest TTL probed (-m)")
    queries: int = Field(1, ge=1, le=10, description="probes per hop (-q)")
    method: Literal["icmp", "udp", "tcp"] = Field(
        "udp", description="probe packets: ICMP echo (-I), UDP (default) or TCP SYN (-T)"
    )
    wait_s: float = Field(
        2.0,
        ge=0.1,
        le=10,
        description="longest wait for a probe (-w)",
        json_schema_extra={"cli": "wait"},
    )
    port: int | None = Field(
        None, ge=1, le=65535, description="UDP base port or TCP destination port (-p)"
    )
    gap_limit: int = Field(
        5,
        ge=0,
        le=255,
        description=(
            "Paris mode: stop after this many silent hops in a row (0: never), as scamper's "
            "gaplimit; one probe is in flight there, so each silent hop costs wait_s"
        ),
    )
    paris: bool = Field(
        True,
        description=(
            "Paris traceroute: every probe of every run on one flow (udp: fixed destination "
            "port -U and source port --sport, from the target's address; tcp: fixed --sport), "
            "so per-flow load balancing cannot make the route flap"
        ),
    )

    @model_validator(mode="after")
    def _port_needs_a_port_method(self) -> Spec:
        if self.port is not None and self.method == "icmp":
            raise ValueError("port has no meaning for method='icmp'; use udp or tcp, or drop it")
        return self

    def deadline_s(self) -> float:
        # --sport (Paris mode) implies one probe in flight (-N 1).
        in_flight = 1 if self.one_flow() else SIMULTANEOUS_PROBES
        batches = math.ceil(self.max_hops * self.queries / in_flight)
        # Bounded by the field ranges: at most 2550 probes * 10 s + margin.
        return batches * self.wait_s + DEADLINE_MARGIN_S

    def one_flow(self) -> bool:
        return self.paris and self.method in ("udp", "tcp")


# Paris mode's flow: destination port 33434 (traceroute's usual base) and a source port fixed
# per target, so every run to it hashes alike; spread over a range so that concurrent traces to
# different targets rarely share one.
PARIS_UDP_PORT = 33434
PARIS_SPORT_BASE, PARIS_SPORT_SPAN = 40000, 8000


def paris_source_port(address: str) -> int:
    return PARIS_SPORT_BASE + zlib.crc32(address.encode()) % PARIS_SPORT_SPAN


def build_argv(spec: Spec, address: str) -> list[str]:
    # Line-buffered, so the gap limit sees each hop as traceroute finishes it.
    head = ["stdbuf", "-oL"] if gap_limited(spec) else []
    argv = [*head, "traceroute", "-n", "-q", str(spec.queries), "-w", f"{spec.wait_s:g}"]
    argv += ["-m", str(spec.max_hops)]
    if spec.method == "icmp":
        argv.append("-I")
    elif spec.method == "tcp":
        argv.append("-T")
    if spec.one_flow():
        if spec.method == "udp":
            argv.append("-U")  # one destination port, not base + probe number
        argv.append(f"--sport={paris_source_port(address)}")
        # -U alone probes port 53; a traceroute port is what firewalls expect to answer.
        if spec.port is None and spec.method == "udp":
            argv += ["-p", str(PARIS_UDP_PORT)]
    if spec.port is not None:
        argv += ["-p", str(spec.port)]
    argv += ["--", address]  # an address can never be taken for an option
    return argv


def gap_limited(spec: Spec) -> bool:
    return spec.one_flow() and 0 < spec.gap_limit < spec.max_hops


_SILENT_HOP_RE = re.compile(rb"^\s*\d{1,3}(?:\s+\*)+\s*$")


def stop_when(spec: Spec) -> Callable[[bytes], bool] | None:
    """Paris mode's gap limit: True once the last ``gap_limit`` complete hop lines are silent."""
    if not gap_limited(spec):
        return None

    def enough(stdout: bytes) -> bool:
        lines = stdout.split(b"\n")[:-1]  # complete lines only
        tail = lines[-spec.gap_limit :]
        return len(tail) == spec.gap_limit and all(_SILENT_HOP_RE.match(t) for t in tail)

    return enough


def _gap_stopped(hop_list: list[dict[str, Any]], spec: Spec | None) -> bool:
    if spec is None or not gap_limited(spec) or len(hop_list) < spec.gap_limit:
        return False
    return all(not h["responses"] for h in hop_list[-spec.gap_limit :])


# --- parsing ---------------------------------------------------------------------------------

_HEADER_RE = re.compile(
    r"^traceroute6? to (?P<name>\S*) *\((?P<addr>[^()\s]*)\), *(?P<max>\d+) hops max"
)
_HOP_RE = re.compile(r"^\s*(?P<ttl>\d{1,3})(?P<rest>(?:\s.*)?)$")
# Every alternative stops at whitespace, so a malformed line costs linear time, never quadratic.
_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<star>\*)(?=\s|$)
      | (?P<rtt>\d+(?:\.\d+)?)\s+ms(?=\s|$)
      | (?P<ann>![^\s]*)
      | \[(?P<asn>[^\]\s]*)\]
      | <(?P<ext>[^>\s]*)>
      | F=(?P<mtu>\d+)(?=\s|$)
      | '(?P<back>-?\d+)'
      | \((?P<paren>[^()\s]*)\)
      | (?P<word>\S+)
    )""",
    re.VERBOSE,
)
_TRACEPATH_RE = re.compile(r"^\s*\d+\??:\s")
_RESOLVE_RE = re.compile(
    r"^(?P<name>.*): (?P<why>Name or service not known|Temporary failure in name resolution|"
    r"No address associated with hostname|Name has no usable address|"
    r"Address family for hostname not supported)$"
)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _same_address(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    ia, ib = _ip(a), _ip(b)
    if ia is not None and ib is not None:
        return ia == ib  # 2001:0db8::1 is 2001:db8::1
    return a == b


class _Hop:
    """One TTL's worth of probes while its line is being read."""

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl
        self.responses: list[dict[str, Any]] = []
        self.lost = 0
        self.annotations: list[str] = []
        self.extensions: list[str] = []

    def as_dict(self) -> dict[str, Any]:
        first = self.responses[0] if self.responses else None
        return {
            "ttl": self.ttl,
            "address": first["address"] if first else None,
            "hostname": first["hostname"] if first else None,
            "rtts_ms": [r["rtt_ms"] for r in self.responses if r["rtt_ms"] is not None],
            "responses": self.responses,
            "probes": len(self.responses) + self.lost,
            "lost": self.lost,
            "annotations": self.annotations,
            "extensions": self.extensions,
        }


def _read_hop(hop: _Hop, text: str) -> int:
    """Add the probes of one hop line to ``hop``; return how many tokens made no sense."""
    junk = 0
    tokens = [m for m in _TOKEN_RE.finditer(text) if m.lastgroup]
    responder: dict[str, Any] | None = None  # address/hostname the next RTTs belong to
    answered = False  # whether ``responder`` got an RTT yet
    last: dict[str, Any] | None = None  # the response an annotation belongs to

    def settle() -> None:
        # An address printed without an RTT (line cut short) still answered.
        if responder is not None and not answered:
            hop.responses.append({**responder, "rtt_ms": None, "annotation": None})

    i = 0
    while i < len(tokens):
        tok = tokens[i]
        kind = tok.lastgroup
        value = tok.group(kind) if kind else ""
        if kind == "word":
            settle()
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is not None and nxt.lastgroup == "paren":
                address = nxt.group("paren")
                responder = {"address": address, "hostname": None if value == address else value}
                i += 1
            elif _ip(value) is not None:
                responder = {"address": value, "hostname": None}
            else:
                responder = None
                junk += 1
            answered = False
            last = None
        elif kind == "paren":  # "(addr)" with no name before it
            settle()
            responder = {"address": value, "hostname": None}
            answered = False
            last = None
        elif kind == "rtt":
            if responder is None:
                junk += 1
            else:
                last = {**responder, "rtt_ms": float(value), "annotation": None}
                hop.responses.append(last)
                answered = True
        elif kind == "star":
            hop.lost += 1
            last = None
        elif kind == "ann":
            if value not in hop.annotations:
                hop.annotations.append(value)
            if last is not None and last["annotation"] is None:
                last["annotation"] = value
        elif kind == "ext" and value not in hop.extensions:
            hop.extensions.append(value)
        # asn, mtu and back-hop marks are accepted and not kept: iepm never asks for them.
        i += 1
    settle()
    return junk


def _fail_without_output(raw: RawRun) -> NoReturn:
    target = raw.argv[-1] if raw.argv else "the target"
    lines = [ln.strip() for ln in (raw.stderr + "\n" + raw.stdout).splitlines() if ln.strip()]
    for line in lines:
        m = _RESOLVE_RE.match(line)
        if m:
            raise ToolFailed(
                f"the name '{m.group('name')}' could not be resolved ({m.group('why')}): check "
                "the target's host name or address in the configuration, and the monitor's DNS "
                "(/etc/resolv.conf)"
            )
    if any(_TRACEPATH_RE.match(ln) for ln in lines):
        raise ParseError(
            "this is tracepath output, not traceroute: iepm parses only Linux traceroute "
            "('traceroute to … hops max' header)"
        )
    stderr = [ln.strip() for ln in raw.stderr.splitlines() if ln.strip()]
    if stderr:
        message = stderr[0]
        hint = ""
        if "privileges" in message or "not permitted" in message:
            hint = " — methods icmp and tcp need root or CAP_NET_RAW on the monitor"
        raise ToolFailed(f"traceroute to {target} failed before probing: {message}{hint}")
    if not lines:
        raise ParseError(
            f"traceroute to {target} printed nothing (exit {raw.returncode}): expected a "
            "'traceroute to … hops max' header and one line per hop"
        )
    raise ParseError(
        "not traceroute output: no 'traceroute to … hops max' header "
        f"(first line: {lines[0][:120]!r})"
    )


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    """Read Linux traceroute output into the probe's data dict.

    Raises ToolFailed when traceroute could not start (unknown host, no privileges) and
    ParseError when the text is not traceroute output.
    """
    header: re.Match[str] | None = None
    hops: dict[int, _Hop] = {}
    unparsed = 0
    for line in raw.stdout.splitlines():
        if not line.strip():
            continue
        if header is None:
            header = _HEADER_RE.match(line.strip())
            if header is None:
                unparsed += 1
            continue
        m = _HOP_RE.match(line)
        if m is None or not 1 <= int(m.group("ttl")) <= 255:
            unparsed += 1
            continue
        ttl = int(m.group("ttl"))
        hop = hops.setdefault(ttl, _Hop(ttl))  # a repeated TTL line adds to the same hop
        unparsed += _read_hop(hop, m.group("rest").rstrip())
    if header is None:
        _fail_without_output(raw)

    destination = header.group("addr") or None
    max_hops = int(header.group("max"))
    hop_list = [h.as_dict() for h in hops.values()]
    last = hop_list[-1] if hop_list else None
    reached = last is not None and any(
        _same_address(r["address"], destination) for r in last["responses"]
    )
    return {
        "destination_name": header.group("name").strip() or None,
        "destination_address": destination,
        "max_hops": max_hops,
        "reached": reached,
        "hop_count": last["ttl"] if last else 0,
        "silent_hops": sum(1 for h in hop_list if not h["responses"]),
        # Stopped by the gap limit (Paris mode) is a finished trace, not a cut one.
        "gap_stopped": not reached and _gap_stopped(hop_list, spec),
        "truncated": bool(
            not reached
            and (last is None or last["ttl"] < max_hops)
            and not (last and last["annotations"])
            and not _gap_stopped(hop_list, spec)
        ),
        "hops": hop_list,
        "unparsed_lines": unparsed,
    }


# --- judging ---------------------------------------------------------------------------------


def _meaning(annotation: str) -> str:
    if annotation.startswith("!F"):
        return ANNOTATIONS["!F"]
    if annotation.startswith("!<"):
        return f"ICMP unreachable code {annotation[2:-1]}"
    return ANNOTATIONS.get(annotation, "unreachable")


def check(data: dict[str, Any], spec: Spec) -> str | None:
    """Why a parsed trace is still a failure: it did not reach the destination."""
    if data.get("reached"):
        return None
    dest = data.get("destination_address") or data.get("destination_name") or "the target"
    hops: list[dict[str, Any]] = data.get("hops") or []
    if not hops:
        return (
            f"traceroute to {dest} printed no hop: it was stopped before the first probe "
            "came back (see diags)"
        )
    last = hops[-1]
    if last["annotations"]:
        ann = last["annotations"][0]
        return (
            f"traceroute to {dest} stopped at hop {last['ttl']}: {last['address']} answered "
            f"{ann} ({_meaning(ann)}) — the route ends there; check the target's address and "
            "the filters on that router"
        )
    answered = [h for h in hops if h["responses"]]
    if data.get("truncated"):
        return (
            f"traceroute to {dest} ended at hop {last['ttl']} of {data.get('max_hops')} "
            "without reaching it: the run was cut short (see diags)"
        )
    other = " or ".join(m for m in ("icmp", "tcp", "udp") if m != spec.method)
    if not answered:
        return (
            f"destination {dest} not reached: no hop answered in {last['ttl']} hops — the "
            f"monitor's own network drops {spec.method} probes or their ICMP replies; "
            f"try method={other}"
        )
    seen = answered[-1]
    return (
        f"destination {dest} not reached within {last['ttl']} hops: the last answer came from "
        f"hop {seen['ttl']} ({seen['address']}), the hops after it are silent — a firewall "
        f"may drop {spec.method} probes; try method={other}"
    )


def summary(data: dict[str, Any]) -> str:
    hops = data.get("hops") or []
    path = " > ".join(h.get("address") or "*" for h in hops)
    reached = "reached" if data.get("reached") else "NOT reached"
    return f"{len(hops)} hops, {reached}: {path}"


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    return await execute(sys.modules[__name__], spec, ctx)
