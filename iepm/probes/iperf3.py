"""iperf3 TCP/UDP throughput probe (client side; the target runs ``iperf3 -s`` or the agent).

Reads the ``-J`` report. Layout notes, learnt from iperf3 3.12 and the esnet/iperf history:

* ``end.sum_received`` is the receiver's view and is what ``throughput_bps`` reports;
  ``end.sum_sent`` is the sender's. In reverse mode (``-R``) the sender is the server, and its
  TCP_INFO figures (cwnd, RTT) are not sent back: they arrive as zeros, which we report as None.
* RTTs (``mean_rtt``, ``min_rtt``, ``max_rtt``) are microseconds; we convert to ms.
* UDP gained ``sum_sent``/``sum_received`` in 3.10 (esnet/iperf#1174). Before that only
  ``end.sum`` exists, whose rate is the *sender's* while jitter/loss are the receiver's; the
  receiver rate is then estimated as rate × (1 − loss). Per-stream UDP entries (``streams[].udp``)
  always carry the sender's bytes and rate, so per-stream UDP ``throughput_bps`` is that estimate.
* Since 3.11, a failed ``-J`` run (connection refused, server busy…) still exits 0
  (esnet/iperf#1405): the top-level ``"error"`` key, not the exit status, says it failed.
* On SIGTERM/SIGINT (our deadline kill) iperf3 still prints its report, with
  ``"error": "interrupt - the client has terminated"`` and the intervals measured so far. Those
  partial figures are kept (``complete`` false) and ``check()`` fails the run.
* ``cpu_utilization_percent.host_total`` is getrusage CPU time over wall time: a percentage of
  *one* CPU (3.12 is single-threaded).
* Per-interval figures exist only for the local side: the sender's rate in a normal test, the
  receiver's in a reverse one. Omitted (``-O``) intervals are dropped.

MHz per Mbit/s (the seeds' "1 MHz per Mbit/s" rule) needs this host's CPU clock, which is not
in iperf3's report. ``parse()`` must stay pure and ``iepm extract`` must reproduce it from the raw
log alone, so ``run()`` reads the clock (``load.local_cpu_mhz()``) and passes it to iperf3 as
``--extra-data cpu_mhz=<MHz>``; iperf3 echoes it in the report's ``extra_data`` and ``parse()``
reads it from there. A report without it gives ``cpu_mhz``/``mhz_per_mbps`` None.

Early stop (``early_stop = true``, TCP sent by this host): the test is started with its full
duration while :mod:`iepm.probes.convergence` samples the sender's TCP_INFO; once the rate has
converged iperf3 is sent SIGINT. The result is a *successful* run with ``early_stopped`` true:
``throughput_bps`` is the estimate of the full test, ``measured_throughput_bps`` what iperf3
itself measured over the part that ran (sender side: the receiver's figures are not exchanged
on an interrupt), ``stopped_after_s``, ``bytes_sent`` and ``bytes_saved``. The estimate is made
of the acknowledged-bytes samples, which iperf3's report lacks (its interval bytes are bytes
written, send buffer included), so the raw record keeps them after iperf3's report as one
``% iepm-convergence`` line; ``parse()`` replays them through the detector, so ``iepm extract``
gives the same result from the raw log.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import re
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any, cast

from pydantic import Field, field_validator, model_validator

from iepm.errors import ConfigError, ParseError, RemoteError, ToolFailed, ToolNotFound
from iepm.probes import convergence, load
from iepm.probes.base import (
    Column,
    Health,
    Metric,
    ProbeContext,
    ProbeMeta,
    ProbeSpec,
    ServerNeed,
    execute,
    failed_result,
    figure,
    result_from_raw,
)
from iepm.results import Result
from iepm.runner import RawRun, tool_version
from iepm.units import size_bytes

NAME = "iperf3"
TOOL = "iperf3"
# The server this probe needs on an agent or SSH target (a kind the agent declares).
SERVER = "iperf3"
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=("iperf3", "--version"),
    server=SERVER,
    default=True,
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "throughput_bps",
        "throughput (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        # A change must be >= 15% of the throughput to reach people.
        alert={"min_relative": 0.15},
        forecast=True,
        # Below half (a fifth) of what the path is expected to carry.
        health=Health("share_of_expected", 50.0, 20.0),
        headline=True,
    ),
    Metric(NAME, "retransmits", "retransmits", "lower", rollup=True),
    Metric(NAME, "mean_rtt_ms", "TCP RTT (ms)", "lower", 1e-3, "seconds"),
    Metric(NAME, "window_bytes", "window (bytes)", "higher", 1.0, "bytes"),
    Metric(NAME, "stream_count", "streams", "higher"),
)
DEFAULT_PORT = 5201

COLUMNS = [
    Column("throughput_bps", "receiver-side throughput, bit/s"),
    Column("sender_throughput_bps", "sender-side throughput, bit/s"),
    Column("bytes_sent", "bytes the sender wrote"),
    Column("bytes_received", "bytes the receiver read"),
    Column("retransmits", "TCP segments retransmitted by the sender"),
    Column("stream_count", "parallel streams that ran"),
    Column("mean_rtt_ms", "mean of the streams' smoothed RTT (TCP sender side), ms"),
    Column("local_cpu_percent", "CPU used by the local iperf3, percent of one CPU"),
    Column("remote_cpu_percent", "CPU used by the remote iperf3, percent of one CPU"),
    Column("cpu_mhz", "local CPU clock at the start of the run, MHz"),
    Column("mhz_per_mbps", "local CPU MHz spent per Mbit/s of throughput"),
    Column("congestion", "sender's TCP congestion control"),
    Column("window_bytes", "requested socket buffer (-w), bytes"),
    Column("jitter_ms", "UDP jitter at the receiver, ms"),
    Column("packets", "UDP datagrams sent"),
    Column("lost_packets", "UDP datagrams lost"),
    Column("loss_percent", "UDP datagrams lost, percent"),
    Column("early_stopped", "stopped once the rate converged; throughput_bps is the estimate"),
    Column("measured_throughput_bps", "early stop: what iperf3 measured before the stop, bit/s"),
    Column("stopped_after_s", "early stop: seconds of data before the stop"),
    Column("bytes_saved", "early stop: bytes the rest of the full test would have sent"),
]

# Linux TCP_CA_NAME_MAX is 16 including the NUL.
CONGESTION_RE = re.compile(r"^[a-z][a-z0-9_]{0,14}$")
MAX_WINDOW_BYTES = 512 * 1024 * 1024  # iperf3's MAX_TCP_BUFFER
EXTRA_DATA_MHZ_RE = re.compile(r"(?:^|\s)cpu_mhz=(\d+(?:\.\d+)?)(?:\s|$)")
INTERRUPTED = "interrupt - the client has terminated"


class Spec(ProbeSpec):
    """One iperf3 client run. Field names are fixed (stored in params, tuned, targets.toml);
    ``iepm probe iperf3`` takes its options from them."""

    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535, description="server port (-p)")
    streams: int = Field(default=1, ge=1, le=128, description="parallel streams (-P)")
    window: str | None = Field(
        default=None,
        description="socket buffer (-w), bytes with K/M/G (binary), e.g. 256K, 4M; up to 512M",
    )
    duration_s: float = Field(
        default=10.0,
        ge=1,
        le=3600,
        description="whole seconds to transmit (-t)",
        json_schema_extra={"cli": "duration"},
    )
    omit_s: int = Field(
        default=0,
        ge=0,
        le=60,
        description="seconds of slow start left out of the figures (-O)",
        json_schema_extra={"cli": "omit"},
    )
    congestion: str | None = Field(
        default=None, description="TCP congestion control (-C), e.g. cubic, bbr"
    )
    reverse: bool = Field(default=False, description="the server sends (-R)")
    udp: bool = Field(default=False, description="UDP: jitter and loss (-u)")
    rate: str | None = Field(
        default=None,
        description="UDP target bitrate (-b), bit/s with K/M/G, e.g. 100M (UDP default 1M)",
    )
    connect_timeout_ms: int = Field(
        default=3000, ge=100, le=60000, description="control connection timeout (--connect-timeout)"
    )
    bind: str | None = Field(default=None, description="local address to send from (-B)")
    early_stop: bool = Field(
        default=False,
        description="stop once the rate has converged and report the full test's estimate "
        "(TCP sent by this host)",
    )

    @field_validator("window")
    @classmethod
    def _window(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            nbytes = size_bytes(value, base=1024)
        except ValueError:
            raise ValueError(
                f"window {value!r} is not like iperf3's -w: a number with an optional "
                "K/M/G suffix (binary multiples), e.g. 256K or 2M"
            ) from None
        if not 0 < nbytes <= MAX_WINDOW_BYTES:
            raise ValueError(f"window {value!r} must be between 1 byte and 512M (iperf3's limit)")
        return value.strip()

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            size_bytes(value, base=1000)
        except ValueError:
            raise ValueError(
                f"rate {value!r} is not like iperf3's -b: bits per second with an optional "
                "K/M/G suffix (decimal multiples), e.g. 100M or 1G; 0 means unlimited"
            ) from None
        return value.strip()

    @field_validator("duration_s")
    @classmethod
    def _whole_seconds(cls, value: float) -> float:
        # iperf3 reads -t with atoi(): 1.5 would silently become 1.
        if not float(value).is_integer():
            raise ValueError(f"duration_s must be a whole number of seconds, not {value}")
        return value

    @field_validator("congestion")
    @classmethod
    def _congestion(cls, value: str | None) -> str | None:
        if value is not None and not CONGESTION_RE.match(value):
            raise ValueError(
                f"congestion {value!r} is not a congestion-control name such as cubic, bbr or "
                "reno (lower case letters, digits, underscore; at most 15 characters)"
            )
        return value

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"bind {value!r} must be a local IPv4 or IPv6 address") from None
        return value

    @model_validator(mode="after")
    def _udp_rules(self) -> Spec:
        if self.udp and self.congestion is not None:
            raise ValueError("congestion applies to TCP only; remove it or udp")
        if self.udp and self.rate is None:
            # iperf3's own UDP default, made explicit so params record what ran.
            self.rate = "1M"
        if self.early_stop and (self.udp or self.reverse):
            raise ValueError(
                "early_stop needs a TCP test sent by this host (it samples this host's TCP "
                "sender state); remove udp/reverse or early_stop"
            )
        if self.early_stop and self.omit_s:
            raise ValueError(
                "early_stop estimates the whole test, slow start included; set omit_s to 0"
            )
        return self

    @property
    def window_bytes(self) -> int | None:
        return None if self.window is None else size_bytes(self.window, base=1024)

    @property
    def rate_bps(self) -> int | None:
        return None if self.rate is None else size_bytes(self.rate, base=1000)

    def deadline_s(self) -> float:
        """Test time plus connect timeout plus a margin for the parameter and result exchange.

        iperf3 waits forever on a server that accepts but never answers (``--rcv-timeout`` in
        3.12 is for reverse-mode data only), so this deadline is what ends such a run.
        """
        test_s = self.duration_s + self.omit_s
        return test_s + self.connect_timeout_ms / 1000 + 4.0 + 0.05 * test_s


def build_argv(spec: Spec, address: str, *, cpu_mhz: float | None = None) -> list[str]:
    """The iperf3 client command. ``cpu_mhz`` (default: this host's, read now) rides along in
    the report, so that parse() stays pure (see the module doc)."""
    if cpu_mhz is None:
        cpu_mhz = load.local_cpu_mhz()
    argv = ["iperf3", "-c", address, "-p", str(spec.port), "-J"]
    argv += ["-t", str(int(spec.duration_s)), "-O", str(spec.omit_s), "-P", str(spec.streams)]
    if spec.window is not None:
        argv += ["-w", spec.window]
    if spec.congestion is not None:
        argv += ["-C", spec.congestion]
    if spec.reverse:
        argv.append("-R")
    if spec.udp:
        argv.append("-u")
    if spec.rate is not None:
        argv += ["-b", spec.rate]
    if spec.bind is not None:
        argv += ["-B", spec.bind]
    argv += ["--connect-timeout", str(spec.connect_timeout_ms)]
    if cpu_mhz is not None:
        argv += ["--extra-data", f"cpu_mhz={cpu_mhz:.3f}"]
    return argv


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    if spec.early_stop:
        result, _ = await run_early(spec, ctx)
        return result
    module = sys.modules[__name__]
    # Agent or SSH target: a one-shot server is started there for this run, on a port the
    # target picks, and always stopped afterwards; a plain endpoint's server is already there.
    need = ServerNeed(
        kind=SERVER,
        duration_s=int(spec.duration_s),
        omit_s=spec.omit_s,
        streams=spec.streams,
        window_bytes=spec.window_bytes,
        rate_bps=spec.rate_bps,
        udp=spec.udp,
        reverse=spec.reverse,
    )
    try:
        async with ctx.server(need) as lease:
            used = spec if lease.port is None else spec.model_copy(update={"port": lease.port})
            result = await execute(module, used, replace(ctx, address=lease.address))
    except (RemoteError, ConfigError) as exc:
        return failed_result(module, spec, ctx, str(exc))
    if not lease.note:
        return result
    return result.model_copy(update={"diags": f"{lease.note}\n{result.diags}"})


async def run_early(
    spec: Spec,
    ctx: ProbeContext,
    cfg: convergence.EarlyStopConfig | None = None,
    *,
    shadow: bool = False,
) -> tuple[Result, convergence.ConvergedRun | None]:
    """A test that stops itself once its rate has converged (``shadow``: runs to its end and
    records when it would have stopped), through the same server lease and raw log as run().
    Also returns the sampler's detail (None when the run could not start)."""
    module = sys.modules[__name__]
    if spec.udp or spec.reverse:
        return failed_result(
            module, spec, ctx, "early stop needs a TCP test sent by this host"
        ), None
    cfg = cfg or convergence.EarlyStopConfig(full_duration_s=int(spec.duration_s))
    spec = spec.model_copy(update={"duration_s": float(cfg.full_duration_s)})
    need = ServerNeed(
        kind=SERVER, duration_s=cfg.full_duration_s, streams=spec.streams,
        window_bytes=spec.window_bytes,
    )  # fmt: skip
    detail: convergence.ConvergedRun | None = None
    try:
        async with ctx.server(need) as lease:
            used = spec if lease.port is None else spec.model_copy(update={"port": lease.port})
            here = replace(ctx, address=lease.address)
            version = await tool_version(here.wrap(META.version_argv or ()))
            argv = here.wrap(build_argv(used, here.address))
            ss = convergence.ss_argv(here.wrap, here.address, used.port)
            try:
                detail = await convergence.run_converging(
                    argv, ss, used.deadline_s(), cfg, shadow=shadow
                )
            except ToolNotFound as exc:
                return failed_result(module, used, here, str(exc), diags=shlex.join(argv)), None
            if here.raw_log is not None:
                params = used.model_dump(mode="json")
                here.raw_log.append(here.target, NAME, detail.raw, params=params)
            result = result_from_raw(module, used, here, detail.raw, version)
    except (RemoteError, ConfigError) as exc:
        return failed_result(module, spec, ctx, str(exc)), None
    if lease.note:
        result = result.model_copy(update={"diags": f"{lease.note}\n{result.diags}"})
    return result, detail


# ---------------------------------------------------------------------------------------------
# parse / check


def summary(data: dict[str, Any]) -> str:
    d = data
    text = (
        f"{mbps(d.get('throughput_bps'))} received, {mbps(d.get('sender_throughput_bps'))} "
        f"sent, retransmits {d.get('retransmits', '-')}"
    )
    if d.get("mean_rtt_ms") is not None:
        text += f", rtt {figure(d.get('mean_rtt_ms'))} ms"
    if d.get("jitter_ms") is not None:
        text += f", jitter {figure(d.get('jitter_ms'))} ms, loss {figure(d.get('loss_percent'))}%"
    if d.get("early_stopped"):
        measured = mbps(d.get("measured_throughput_bps"))
        saved_mb = (d.get("bytes_saved") or 0) / 1e6
        text = (
            f"{mbps(d.get('throughput_bps'))} estimated for the full test, early-stopped after "
            f"{figure(d.get('stopped_after_s'))} s (measured {measured} sent, {saved_mb:.1f} MB "
            f"saved), retransmits {d.get('retransmits', '-')}"
        )
    return text


def mbps(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:.1f} Mbit/s"


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    """Figures from an iperf3 ``-J`` report; ToolFailed for iperf3's own errors, ParseError for
    output that is not a report. An interrupted run that measured something returns its partial
    figures with ``complete`` false and ``tool_error`` set (``check()`` fails it)."""
    client = ClientArgs.from_argv(raw.argv)
    doc = _document(raw, client)
    try:
        conv = convergence.read_samples(raw.stdout)
    except ValueError as exc:
        raise ParseError(f"iperf3 early-stop record for {client.where}: {exc}") from None
    start = _obj(doc.get("start"))
    end = _obj(doc.get("end"))
    intervals = _list(doc.get("intervals"))
    error = doc.get("error")
    if error is not None:
        measured = _measured(intervals)
        message = explain_error(str(error), client, measured=measured)
        if not measured:
            raise ToolFailed(message)
        data = _figures(doc, start, end, intervals)
        # The receiver's figures are exchanged only at the end: an interrupted run reports
        # them as zeros, which mean "unknown", not "nothing arrived".
        for item in [data, *data["streams"]]:
            for key in ("throughput_bps", "bytes_received", "remote_cpu_percent"):
                if key in item and not item[key]:
                    item[key] = None
        data.update(complete=False, tool_error=message, mhz_per_mbps=None)
        if conv is not None:
            _early_stopped(data, conv, interrupted=INTERRUPTED in str(error).lower())
        return data
    if not end:
        raise ParseError(
            f"iperf3 report for {client.where} has no 'end' summary and no 'error'; "
            "the output is not a finished iperf3 -J report"
        )
    data = _figures(doc, start, end, intervals)
    data["complete"] = True
    if conv is not None:
        data.update(early_stopped=False, stopped_after_s=None, bytes_saved=0)
        data["measured_throughput_bps"] = data["throughput_bps"]
    return data


def _early_stopped(data: dict[str, Any], conv: convergence.Convergence, interrupted: bool) -> None:
    """An interrupted report that our own SIGINT ended: the detector's replay over the recorded
    samples gives the full test's estimate (``data`` updated in place)."""
    data.update(early_stopped=False, stopped_after_s=None, bytes_saved=0)
    data["measured_throughput_bps"] = data["sender_throughput_bps"]
    if conv.stop_signal_s is None or not interrupted:
        return  # not ours: the deadline, or something else, ended it
    decision = convergence.replay(conv.cfg, conv.samples)
    if decision is None:
        data["tool_error"] = (
            f"iperf3 was stopped early after {conv.stop_signal_s:g} s, but the recorded TCP_INFO "
            "samples no longer reach a decision with this detector (no estimate)"
        )
        return
    full_s = conv.cfg.full_duration_s
    full_bytes = decision.full_bytes(full_s)
    sent = data.get("bytes_sent") or 0
    data.update(
        early_stopped=True,
        tool_error=None,
        throughput_bps=decision.estimate_bps,
        stopped_after_s=decision.t_stop_s,
        full_duration_s=full_s,
        slow_start_end_s=decision.slow_start_end_s,
        slow_start_by=decision.slow_start_by,
        steady_throughput_bps=decision.steady_bps,
        bytes_acked=decision.acked_bytes,
        estimated_full_bytes=full_bytes,
        # Conservative: bytes written (send buffer included) against bytes the receiver gets.
        bytes_saved=max(0, full_bytes - sent),
    )
    data["mhz_per_mbps"] = mhz_per_mbps(
        data["local_cpu_percent"], data["cpu_mhz"], data["measured_throughput_bps"]
    )


def check(data: dict[str, Any], spec: Spec) -> str | None:
    """Why a parsed run is still a failure: interrupted, or nothing got through."""
    if data.get("early_stopped"):
        return None if data.get("throughput_bps") else "early stop estimated zero throughput"
    if not data.get("complete", True):
        return str(data.get("tool_error") or "iperf3 did not finish the test")
    throughput = data.get("throughput_bps")
    if not throughput:
        if data.get("protocol") == "UDP" and data.get("packets"):
            return (
                f"UDP throughput was zero: {data.get('lost_packets')} of {data.get('packets')} "
                "datagrams were lost — a firewall dropping UDP, or a rate far above the path's?"
            )
        return (
            "iperf3 measured zero throughput at the receiver — the data connections were "
            "blocked or stalled (firewall on the data port? path MTU black hole?)"
        )
    return None


def explain_error(error: str, client: ClientArgs, *, measured: bool = False) -> str:
    """iperf3's error text turned into something a person can act on (original kept)."""
    text = error.strip()
    if text.startswith("error - "):  # 3.0.x prefixed it
        text = text[len("error - ") :]
    low = text.lower()
    where = client.where
    said = f"(iperf3: {text})"
    if INTERRUPTED in low:
        if measured:
            return (
                f"iperf3 to {where} was interrupted before the test finished (partial figures kept)"
            )
        # The report cannot tell a hung name lookup from a server that accepted and went
        # quiet (--connect-timeout bounds only connect()), so name the likely causes.
        return (
            f"iperf3 to {where} was interrupted before any data was measured: the test never "
            "started — a stalled iperf3 server, something other than iperf3 listening on that "
            "port, or a name lookup that hung?"
        )
    if "connection refused" in low:
        return (
            f"nothing listening on {where} — is the iperf3 server (or iepm agent) running? {said}"
        )
    if any(
        s in low
        for s in (
            "name or service not known",
            "temporary failure in name resolution",
            "no address associated",
            "nodename nor servname",
        )
    ):
        return f"cannot resolve '{client.host}' — check the target's address or DNS {said}"
    if "unable to connect" in low and "invalid argument" in low and not _is_ip(client.host):
        # iperf3 3.9-3.12 report a failed getaddrinfo() with a stale errno (EINVAL); with a
        # name (not an address) to connect to, that is a name that did not resolve.
        return f"cannot resolve '{client.host}' — check the target's address or DNS {said}"
    if "timed out" in low and "connect" in low:
        within = (
            f" within the {client.connect_timeout_ms} ms connect timeout"
            if client.connect_timeout_ms
            else ""
        )
        return (
            f"no answer from {where}{within} — host down, a firewall dropping port "
            f"{client.port}, or a wrong address {said}"
        )
    if "no route to host" in low or "network is unreachable" in low:
        return f"{where} is unreachable from this host (no route) — check routing {said}"
    if "busy running a test" in low:
        return (
            f"the iperf3 server on {where} is busy with another test (another monitor, or a "
            f"stuck client holding it); retry later {said}"
        )
    if "congestion" in low:
        name = client.congestion or "requested"
        return (
            f"TCP congestion control '{name}' is not available — see "
            f"/proc/sys/net/ipv4/tcp_available_congestion_control (modprobe tcp_{name}) {said}"
        )
    if "control socket has closed" in low or "server has terminated" in low:
        return f"the iperf3 server on {where} went away mid-test (crashed or restarted?) {said}"
    return f"iperf3 to {where} failed: {text}"


def mhz_per_mbps(
    cpu_percent: float | None, cpu_mhz: float | None, throughput_bps: float | None
) -> float | None:
    """CPU MHz spent per Mbit/s: (percent of one CPU × its MHz) / Mbit/s."""
    if cpu_percent is None or cpu_mhz is None or not throughput_bps or throughput_bps <= 0:
        return None
    value = (cpu_percent / 100.0 * cpu_mhz) / (throughput_bps / 1e6)
    return float(f"{value:.6g}")  # six significant figures: loopback gives ~0.1, WANs ~1


# ---------------------------------------------------------------------------------------------
# internals


@dataclass(frozen=True)
class ClientArgs:
    """What the command line says about the target, for error messages."""

    host: str
    port: int
    connect_timeout_ms: int | None
    congestion: str | None

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def from_argv(cls, argv: tuple[str, ...]) -> ClientArgs:
        opts: dict[str, str] = {}
        names = {"-c": "host", "--client": "host", "-p": "port", "--port": "port"}
        names |= {"--connect-timeout": "timeout", "-C": "cc", "--congestion": "cc"}
        for flag, value in itertools.pairwise(argv):
            if flag in names:
                opts.setdefault(names[flag], value)
        port = _int(opts.get("port"))
        return cls(
            opts.get("host", "the server"),
            port if port is not None else DEFAULT_PORT,
            _int(opts.get("timeout")),
            opts.get("cc"),
        )


def _document(raw: RawRun, client: ClientArgs) -> dict[str, Any]:
    text = raw.stdout
    if not text.strip():
        complaint = next(
            (ln.strip() for ln in reversed(raw.stderr.splitlines()) if ln.strip()), None
        )
        if complaint:
            # Usage/parameter errors go to stderr even with -J.
            raise ToolFailed(f"iperf3 to {client.where} printed no report; it said: {complaint}")
        raise ParseError(
            f"iperf3 to {client.where} printed no report (exit {raw.returncode}); it was "
            "killed or crashed before writing it"
        )
    begin = text.find("{")
    try:
        if begin < 0:
            raise ValueError("no '{' in the output")
        doc, _ = json.JSONDecoder().raw_decode(text, begin)
    except (ValueError, RecursionError) as exc:
        raise ParseError(
            f"iperf3 output for {client.where} is not a complete JSON report "
            f"({len(text)} chars; cut short by a kill, or not iperf3 -J output?): {exc}"
        ) from None
    return cast(dict[str, Any], doc)  # decoding from a "{" always yields an object


def _measured(intervals: list[Any]) -> bool:
    return any((_int(_obj(_obj(iv).get("sum")).get("bytes")) or 0) > 0 for iv in intervals)


def _figures(
    doc: dict[str, Any], start: dict[str, Any], end: dict[str, Any], intervals: list[Any]
) -> dict[str, Any]:
    test_start = _obj(start.get("test_start"))
    raw_streams = [_obj(s) for s in _list(end.get("streams"))]
    protocol = _str(test_start.get("protocol"))
    if protocol is None:
        protocol = "UDP" if any("udp" in s for s in raw_streams) else "TCP"
    udp = protocol == "UDP"
    reverse = bool(_int(test_start.get("reverse")))
    sum_sent = _obj(end.get("sum_sent"))
    sum_received = _obj(end.get("sum_received"))

    data: dict[str, Any] = {"protocol": protocol, "reverse": reverse}
    data["test_duration_s"] = _num(test_start.get("duration"))
    data["omit_s"] = _num(test_start.get("omit"))
    if udp:
        streams = [_udp_stream(_obj(s.get("udp"))) for s in raw_streams]
        # 3.10+ has sum_received; before, only "sum" (sender rate, receiver loss).
        loss_view = sum_received if sum_received else _obj(end.get("sum"))
        sender_view = sum_sent if sum_sent else _obj(end.get("sum"))
        data["sender_throughput_bps"] = _num(sender_view.get("bits_per_second"))
        data["bytes_sent"] = _int(sender_view.get("bytes"))
        if sum_received:
            data["throughput_bps"] = _num(sum_received.get("bits_per_second"))
            data["bytes_received"] = _int(sum_received.get("bytes"))
        else:
            data["throughput_bps"] = _delivered(
                data["sender_throughput_bps"], _num(loss_view.get("lost_percent"))
            )
            data["bytes_received"] = None
        data["retransmits"] = None
        data["jitter_ms"] = _num(loss_view.get("jitter_ms"))
        data["packets"] = _int(loss_view.get("packets"))
        data["lost_packets"] = _int(loss_view.get("lost_packets"))
        data["loss_percent"] = _num(loss_view.get("lost_percent"))
    else:
        streams = [_tcp_stream(_obj(s.get("sender")), _obj(s.get("receiver"))) for s in raw_streams]
        data["throughput_bps"] = _num(sum_received.get("bits_per_second"))
        data["sender_throughput_bps"] = _num(sum_sent.get("bits_per_second"))
        data["bytes_received"] = _int(sum_received.get("bytes"))
        data["bytes_sent"] = _int(sum_sent.get("bytes"))
        data["retransmits"] = _int(sum_sent.get("retransmits"))
    data["stream_count"] = len(streams)
    data["streams"] = streams

    rtts = [s["mean_rtt_ms"] for s in streams if s.get("mean_rtt_ms") is not None]
    mins = [s["min_rtt_ms"] for s in streams if s.get("min_rtt_ms") is not None]
    maxs = [s["max_rtt_ms"] for s in streams if s.get("max_rtt_ms") is not None]
    data["mean_rtt_ms"] = round(sum(rtts) / len(rtts), 3) if rtts else None
    data["min_rtt_ms"] = min(mins) if mins else None
    data["max_rtt_ms"] = max(maxs) if maxs else None

    cpu = _obj(end.get("cpu_utilization_percent"))
    data["local_cpu_percent"] = _num(cpu.get("host_total"))
    data["remote_cpu_percent"] = _num(cpu.get("remote_total"))
    data["congestion"] = None if udp else _str(end.get("sender_tcp_congestion"))
    data["receiver_congestion"] = None if udp else _str(end.get("receiver_tcp_congestion"))

    requested = _int(start.get("sock_bufsize"))
    data["window_bytes"] = requested if requested else None  # 0: -w not given
    data["sndbuf_actual_bytes"] = _int(start.get("sndbuf_actual"))
    data["rcvbuf_actual_bytes"] = _int(start.get("rcvbuf_actual"))

    connected = [_obj(c) for c in _list(start.get("connected"))]
    data["remote_ip"] = _str(connected[0].get("remote_host")) if connected else None

    per_interval = []
    for iv in intervals:
        total = _obj(_obj(iv).get("sum"))
        bps = _num(total.get("bits_per_second"))
        if total.get("omitted") is not True and bps is not None:
            per_interval.append(bps)
    data["interval_throughput_bps"] = per_interval

    extra = doc.get("extra_data")
    match = EXTRA_DATA_MHZ_RE.search(extra) if isinstance(extra, str) else None
    data["cpu_mhz"] = _num(float(match.group(1))) if match else None
    data["mhz_per_mbps"] = mhz_per_mbps(
        data["local_cpu_percent"], data["cpu_mhz"], data["throughput_bps"]
    )
    return data


def _tcp_stream(sender: dict[str, Any], receiver: dict[str, Any]) -> dict[str, Any]:
    return {
        "socket": _int(sender.get("socket", receiver.get("socket"))),
        "throughput_bps": _num(receiver.get("bits_per_second")),
        "sender_throughput_bps": _num(sender.get("bits_per_second")),
        "bytes_sent": _int(sender.get("bytes")),
        "bytes_received": _int(receiver.get("bytes")),
        "retransmits": _int(sender.get("retransmits")),
        # Zero means "not reported" (reverse mode: the server's TCP_INFO is not sent back).
        "max_snd_cwnd_bytes": _int(sender.get("max_snd_cwnd")) or None,
        "max_snd_wnd_bytes": _int(sender.get("max_snd_wnd")) or None,
        "mean_rtt_ms": _us_to_ms(sender.get("mean_rtt")),
        "min_rtt_ms": _us_to_ms(sender.get("min_rtt")),
        "max_rtt_ms": _us_to_ms(sender.get("max_rtt")),
    }


def _udp_stream(udp: dict[str, Any]) -> dict[str, Any]:
    sender_bps = _num(udp.get("bits_per_second"))
    return {
        "socket": _int(udp.get("socket")),
        "throughput_bps": _delivered(sender_bps, _num(udp.get("lost_percent"))),
        "sender_throughput_bps": sender_bps,
        "bytes_sent": _int(udp.get("bytes")),
        "jitter_ms": _num(udp.get("jitter_ms")),
        "packets": _int(udp.get("packets")),
        "lost_packets": _int(udp.get("lost_packets")),
        "loss_percent": _num(udp.get("lost_percent")),
        "out_of_order_packets": _int(udp.get("out_of_order")),
    }


def _delivered(sender_bps: float | None, loss_percent: float | None) -> float | None:
    """Receiver rate estimated from the sender's rate and the receiver's loss."""
    if sender_bps is None or loss_percent is None:
        return None
    return sender_bps * max(0.0, 1.0 - loss_percent / 100.0)


def _us_to_ms(value: Any) -> float | None:
    us = _num(value)
    return round(us / 1000.0, 3) if us else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _num(value: Any) -> float | None:
    """A finite JSON number as float; anything else (bool, str, NaN, 1e400 int) → None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    """A JSON integer (or an integral float, or a decimal string from argv) as int."""
    if isinstance(value, str):
        return int(value) if value.isascii() and value.isdigit() and len(value) < 20 else None
    number = _num(value)
    if number is None or not number.is_integer():
        return None
    return int(number)


def _is_ip(host: str | None) -> bool:
    try:
        ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    return True
