"""NetFlow v5, v9 and IPFIX (v10) export packets → :class:`Flow` tuples.

Written with :mod:`struct` rather than a library: the maintained Python decoder
(bitkeks/python-netflow-v9-softflowd) builds an object and an ``ipaddress`` value per field and
keys templates by template ID alone, which mixes exporters and observation domains and is an
order of magnitude slower than what the collector needs. Here each template is compiled once
into a :class:`struct.Struct` for its whole record, so a data set is read with one
``iter_unpack`` (C) and a few index lookups per record.

Templates live per (exporter, observation domain / source ID, template ID), as RFC 7011 §8 and
RFC 3954 §5 scope them; a re-sent template replaces the old one (refresh). Sequence numbers are
followed per (exporter, domain): a jump forward is counted as loss (records for v5 and IPFIX,
whose sequence counts records; packets for v9, whose sequence counts packets). Nothing in a
packet can raise: every problem is a counter in :class:`DecodeStats`.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from iepm.flows.records import Flow, FlowColumns

# Bounds against a flood of templates (a broken or hostile exporter): beyond these, new
# templates are refused and counted, so memory stays bounded.
MAX_TEMPLATES_PER_DOMAIN = 1024
MAX_DOMAINS = 4096
VARIABLE = 0xFFFF
# A sequence number further back than this is an exporter restart, not reordering.
RESTART_WINDOW = 1 << 20


@dataclass
class DecodeStats:
    """What the decoder met, for the collector's report."""

    packets: int = 0
    records: int = 0
    truncated: int = 0  # packets or sets cut short, or lengths that do not add up
    bad_version: int = 0
    unknown_template: int = 0  # data sets whose template has not arrived (yet)
    templates: int = 0  # templates learnt or refreshed
    templates_refused: int = 0  # over MAX_TEMPLATES_PER_DOMAIN / MAX_DOMAINS, or malformed
    options_records: int = 0
    zero_bytes: int = 0  # records kept but worth a look: no bytes, or no duration
    zero_duration: int = 0
    # Records dropped because a counter or time is beyond a signed 64-bit column (an 8-byte
    # unsigned counter near 2^64): one such record must not fail its whole batch in the archive.
    out_of_range: int = 0
    lost: int = 0  # records (v5, IPFIX) or packets (v9) missing by sequence number
    lost_packets_v9: int = 0
    out_of_order: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


INT64_MAX = 2**63 - 1  # the archive's integer columns are signed 64-bit

# Information elements the flow table reads (IANA numbers, shared by v9 and IPFIX).
IN_BYTES, IN_PKTS, PROTO, SPORT, SRC4, DPORT, DST4 = 1, 2, 4, 7, 8, 11, 12
LAST_UPTIME, FIRST_UPTIME, SRC6, DST6, SAMPLING_INTERVAL = 21, 22, 27, 28, 34
START_S, END_S, START_MS, END_MS, START_US, END_US = 150, 151, 152, 153, 154, 155
SAMPLER_RANDOM_INTERVAL, SYSTEM_INIT_MS, SAMPLING_PACKET_INTERVAL = 50, 160, 305
NUMERIC = {
    IN_BYTES, IN_PKTS, PROTO, SPORT, DPORT, LAST_UPTIME, FIRST_UPTIME, SAMPLING_INTERVAL,
    START_S, END_S, START_MS, END_MS, START_US, END_US, SAMPLER_RANDOM_INTERVAL,
    SYSTEM_INIT_MS, SAMPLING_PACKET_INTERVAL,
}  # fmt: skip
ADDRESS = {SRC4: 4, DST4: 4, SRC6: 16, DST6: 16}
CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
NP_CODES = {1: "u1", 2: ">u2", 4: ">u4", 8: ">u8"}
NTP_EPOCH_OFFSET_S = 2_208_988_800


class Template:
    """A data template compiled for reading: one struct for fixed-length records, and the
    position of each element the flow table reads."""

    __slots__ = (
        "dtype", "fast", "fields", "index", "is_options", "length", "scope_count", "struct",
        "wide",
    )  # fmt: skip

    def __init__(
        self, fields: list[tuple[int, int, int]], *, is_options: bool = False, scope_count: int = 0
    ) -> None:
        self.fields = fields  # (element id, length, enterprise number or 0)
        self.is_options = is_options
        self.scope_count = scope_count
        self.index: dict[int, int] = {}
        self.wide: set[int] = set()  # numbers of unusual width, read with int.from_bytes
        variable = any(length == VARIABLE for _, length, _ in fields)
        self.length = 0 if variable else sum(length for _, length, _ in fields)
        self.struct: struct.Struct | None = None
        self.fast: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        if variable:
            return
        codes = []
        offsets: dict[int, tuple[int, int]] = {}  # element → (byte offset, length)
        offset = 0
        for element, length, enterprise in fields:
            at, offset = offset, offset + length
            if enterprise == 0 and element in NUMERIC and element not in self.index:
                offsets[element] = (at, length)
                self.index[element] = len([c for c in codes if not c.endswith("x")])
                if length in CODES:
                    codes.append(CODES[length])
                else:
                    codes.append(f"{length}s")
                    self.wide.add(element)
            elif enterprise == 0 and ADDRESS.get(element) == length and element not in self.index:
                offsets[element] = (at, length)
                self.index[element] = len([c for c in codes if not c.endswith("x")])
                codes.append(f"{length}s")
            else:
                codes.append(f"{length}x")
        self.struct = struct.Struct("!" + "".join(codes))
        self.fast = self._fast_plan()
        if self.fast is not None and self.length > 0:
            self.dtype = self._dtype(offsets)

    def _dtype(self, offsets: dict[int, tuple[int, int]]) -> np.dtype:
        """The record as a numpy structured dtype (the fast plan's elements, big-endian), so a
        whole data set is read with one ``np.frombuffer``."""
        assert self.fast is not None
        kind = self.fast[9]
        first, last = ((START_MS, END_MS), (START_S, END_S), (FIRST_UPTIME, LAST_UPTIME))[kind]
        wanted = {
            "src": SRC4, "dst": DST4, "sport": SPORT, "dport": DPORT, "proto": PROTO,
            "bytes": IN_BYTES, "pkts": IN_PKTS, "first": first, "last": last,
            "samp": SAMPLING_INTERVAL,
        }  # fmt: skip
        names, formats, at = [], [], []
        for name, element in wanted.items():
            if element in self.index:  # the fast plan read it: an ordinary width
                where, length = offsets[element]
                names.append(name)
                formats.append(NP_CODES[length])
                at.append(where)
        return np.dtype(
            {"names": names, "formats": formats, "offsets": at, "itemsize": self.length}
        )

    def _fast_plan(self) -> tuple[int, ...] | None:
        """Positions for building a Flow straight from the unpacked tuple — the common shape
        (IPv4, ordinary widths, ms / s / uptime times) — or None to go through a dict."""
        index, wide = self.index, self.wide
        if self.is_options or SRC4 not in index or DST4 not in index:
            return None
        if any(e in wide for e in (IN_BYTES, IN_PKTS, SPORT, DPORT, PROTO, SAMPLING_INTERVAL)):
            return None
        if START_US in index or END_US in index:
            return None
        # The same preference as _record: ms, then s, then uptime.
        pairs = ((START_MS, END_MS), (START_S, END_S), (FIRST_UPTIME, LAST_UPTIME))
        present = [k for k, (a, b) in enumerate(pairs) if a in index and b in index]
        if not present:
            return None
        kind = present[0]
        first, last = pairs[kind]
        if first in wide or last in wide:
            return None
        pos = [index.get(e, -1) for e in (SPORT, DPORT, PROTO, IN_BYTES, IN_PKTS)]
        return (index[SRC4], index[DST4], *pos, index[first], index[last], kind,
                index.get(SAMPLING_INTERVAL, -1))  # fmt: skip

    def values(self, record: bytes) -> dict[int, int | bytes]:
        """The elements of one variable-length record (RFC 7011 §7), by element id."""
        out: dict[int, int | bytes] = {}
        pos = 0
        for element, length, enterprise in self.fields:
            if length == VARIABLE:
                if pos >= len(record):
                    raise ValueError("variable-length field past the record")
                length = record[pos]
                pos += 1
                if length == 255:
                    if pos + 2 > len(record):
                        raise ValueError("variable-length field past the record")
                    length = int.from_bytes(record[pos : pos + 2])
                    pos += 2
            value = record[pos : pos + length]
            if len(value) < length:
                raise ValueError("field past the record")
            pos += length
            if enterprise == 0 and element not in out:
                if element in NUMERIC:
                    out[element] = int.from_bytes(value)
                elif ADDRESS.get(element) == length:
                    out[element] = value
        return out


@dataclass
class _Domain:
    templates: dict[int, Template]
    next_seq: int | None = None
    sampling: int = 1
    system_init_ms: int | None = None
    # v9 exporter's boot time, Unix ms: the tightest lower bound seen (see _v9).
    boot_ms: int | None = None


V5_HEADER = struct.Struct("!HHIIIIBBH")
V5_RECORD = struct.Struct("!4s4s4sHHIIIIHHxBBBHHBBxx")
V9_HEADER = struct.Struct("!HHIIII")
IPFIX_HEADER = struct.Struct("!HHIII")
SET_HEADER = struct.Struct("!HH")
WORD = struct.Struct("!H")


class Decoder:
    """Decodes export packets from any number of exporters, keeping their templates and
    sequence numbers. Not thread-safe: one decoder per receiving thread."""

    def __init__(self, *, vectorised: bool = True) -> None:
        self.stats = DecodeStats()
        self._domains: dict[tuple[str, int, int], _Domain] = {}
        # False: every record through the per-record path (the reference the tests hold the
        # numpy path to).
        self.vectorised = vectorised

    def decode(self, packet: bytes, exporter: str) -> list[Flow]:
        """The flow records in one export packet from ``exporter`` (its address)."""
        return self._finish(self._parts(packet, exporter)).flows()

    def decode_many(self, packets: Iterable[tuple[bytes, str]]) -> list[Flow]:
        """The flow records of many (packet, exporter) pairs, as :meth:`decode` of each in turn
        would give them."""
        return self.decode_columns(packets).flows()

    def decode_columns(self, packets: Iterable[tuple[bytes, str]]) -> FlowColumns:
        """:meth:`decode_many`'s records as columns (the collector's hot path: no tuple per
        record). Data sets of one layout in a row are turned into columns together: numpy's cost
        per call is paid per run of packets, not per packet of 30 records."""
        parts: list[Flow | _Columns] = []
        for packet, exporter in packets:
            parts += self._parts(packet, exporter)
        return self._finish(parts)

    def _parts(self, packet: bytes, exporter: str) -> list[Flow | _Columns]:
        self.stats.packets += 1
        if len(packet) < 2:
            self.stats.truncated += 1
            return []
        version = WORD.unpack_from(packet)[0]
        try:
            if version == 5:
                return self._v5(packet, exporter)  # type: ignore[return-value]
            if version == 9:
                return self._v9(packet, exporter)  # type: ignore[return-value]
            if version == 10:
                return self._ipfix(packet, exporter)  # type: ignore[return-value]
        except struct.error:
            self.stats.truncated += 1
            return []
        self.stats.bad_version += 1
        return []

    def _finish(self, parts: list[Flow | _Columns]) -> FlowColumns:
        """Data sets read by numpy and per-record flows → columns, in order, counted."""
        out = FlowColumns()
        pending: list[Flow] = []
        run: list[_Columns] = []
        for item in parts:
            if type(item) is _Columns:
                if pending:
                    out.extend(FlowColumns.of(self._checked(pending)))
                    pending = []
                if run and not item.joins(run[0]):  # type: ignore[union-attr]
                    out.extend(self._materialise(run))
                    run = []
                run.append(item)  # type: ignore[arg-type]
            else:
                if run:
                    out.extend(self._materialise(run))
                    run = []
                pending.append(item)  # type: ignore[arg-type]
        if run:
            out.extend(self._materialise(run))
        if pending:
            out.extend(FlowColumns.of(self._checked(pending)))
        return out

    def _checked(self, flows: list[Flow]) -> list[Flow]:
        """The per-record path's flows counted, those out of the archive's range dropped."""
        if any(
            max(f.bytes, f.packets, f.start_ms, f.end_ms, f.sampling) > INT64_MAX for f in flows
        ):
            kept = [
                f for f in flows
                if max(f.bytes, f.packets, f.start_ms, f.end_ms, f.sampling) <= INT64_MAX
            ]  # fmt: skip
            self.stats.out_of_range += len(flows) - len(kept)
            flows = kept
        self.stats.records += len(flows)
        for flow in flows:
            if flow.bytes == 0:
                self.stats.zero_bytes += 1
            if flow.end_ms <= flow.start_ms:
                self.stats.zero_duration += 1
        return flows

    def _materialise(self, run: list[_Columns]) -> FlowColumns:
        """Data sets of one layout read by numpy → columns, counted exactly as :meth:`_checked`
        counts the per-record path's: the arithmetic and the range checks on whole arrays, exact
        (a result beyond the archive's signed 64 bits is dropped and counted, never wrapped),
        Python ints made last."""
        c = run[0]
        names = c.records.dtype.names or ()
        counts = [len(r.records) for r in run]
        a = c.records if len(run) == 1 else np.concatenate([r.records for r in run])
        n = len(a)

        def each(values: list[int], dtype: type) -> np.ndarray:  # a value per data set → per record
            return np.repeat(np.array(values, dtype=dtype), counts)

        first, last = a["first"], a["last"]
        bad = _above(first, INT64_MAX if c.kind == 0 else INT64_MAX // 1000)
        bad = bad | _above(last, INT64_MAX if c.kind == 0 else INT64_MAX // 1000)
        if c.kind == 0:  # ms
            start, end = first.astype(np.int64), last.astype(np.int64)
        elif c.kind == 1:  # s
            start, end = first.astype(np.int64) * 1000, last.astype(np.int64) * 1000
        elif c.mode == UP:  # now - ((uptime - t) mod 2^32), any width of t
            bad = False
            now = each([r.p1 for r in run], np.int64)
            up = each([r.p2 for r in run], np.uint64)
            mask = np.uint64(0xFFFFFFFF)
            start = now - ((up - first.astype(np.uint64)) & mask).astype(np.int64)
            end = now - ((up - last.astype(np.uint64)) & mask).astype(np.int64)
        elif c.mode == INIT:  # systemInitTimeMilliseconds + t
            inits = [r.p1 for r in run]
            init = each([i if i <= INT64_MAX else 0 for i in inits], np.uint64)
            room = np.uint64(INT64_MAX) - init
            f64, l64 = first.astype(np.uint64), last.astype(np.uint64)
            bad = (f64 > room) | (l64 > room)
            if max(inits) > INT64_MAX:
                bad |= each([i > INT64_MAX for i in inits], np.bool_)
            start, end = (f64 + init).astype(np.int64), (l64 + init).astype(np.int64)
        else:  # the export time is all we know
            bad = False
            start = end = each([r.p1 for r in run], np.int64)
        rates = [r.rate for r in run]
        rate_bad = max(rates) > INT64_MAX
        if rate_bad:
            big = each([x > INT64_MAX for x in rates], np.bool_)
            rates = [x if x <= INT64_MAX else 0 for x in rates]
        if "samp" in names:
            samp = a["samp"]
            zero = samp == 0
            bad = bad | _above(samp, INT64_MAX)
            if rate_bad:
                bad = bad | (zero & big)
            sampling: np.ndarray | int = np.where(
                zero, each(rates, np.int64), samp.astype(np.int64)
            )
        elif len(set(rates)) == 1 and not rate_bad:
            sampling = rates[0]
        else:
            sampling = each(rates, np.int64)
            if rate_bad:
                bad = bad | big
        for name in ("bytes", "pkts"):
            if name in names:
                bad = bad | _above(a[name], INT64_MAX)
        exporters: list[str]
        domains: list[int]
        versions: list[int]
        if len(run) == 1:
            exporters, domains, versions = [c.exporter] * n, [c.domain] * n, [c.version] * n
        else:
            exporters, domains, versions = [], [], []
            for r, k in zip(run, counts, strict=True):
                exporters += [r.exporter] * k
                domains += [r.domain] * k
                versions += [r.version] * k
        if isinstance(bad, np.ndarray) and bad.any():
            keep = ~bad
            self.stats.out_of_range += int(np.count_nonzero(bad))
            a, start, end = a[keep], start[keep], end[keep]
            if isinstance(sampling, np.ndarray):
                sampling = sampling[keep]
            kept = keep.tolist()
            exporters = [x for x, k in zip(exporters, kept, strict=False) if k]
            domains = [x for x, k in zip(domains, kept, strict=False) if k]
            versions = [x for x, k in zip(versions, kept, strict=False) if k]
            n = len(a)
        if n == 0:
            return FlowColumns()
        self.stats.records += n
        zeros = np.zeros(n, dtype=np.int64)
        octets = a["bytes"] if "bytes" in names else zeros
        self.stats.zero_bytes += n - int(np.count_nonzero(octets))
        self.stats.zero_duration += int(np.count_nonzero(end <= start))
        pack, ntoa = _U32.pack, socket.inet_ntoa
        columns: list[list[Any]] = [
            exporters, domains, versions,
            list(map(ntoa, map(pack, a["src"].tolist()))),
            list(map(ntoa, map(pack, a["dst"].tolist()))),
        ]  # fmt: skip
        for name in ("sport", "dport", "proto", "bytes", "pkts"):
            columns.append((a[name] if name in names else zeros).tolist())
        columns += [start.tolist(), end.tolist()]
        columns.append(sampling.tolist() if isinstance(sampling, np.ndarray) else [sampling] * n)
        return FlowColumns(columns)

    def template_count(self) -> int:
        return sum(len(d.templates) for d in self._domains.values())

    # -- sequence numbers ------------------------------------------------------------------

    def _domain(self, exporter: str, version: int, domain: int) -> _Domain | None:
        key = (exporter, version, domain)
        found = self._domains.get(key)
        if found is None:
            if len(self._domains) >= MAX_DOMAINS:
                return None
            found = self._domains[key] = _Domain({})
        return found

    def _sequence(self, state: _Domain, seq: int, advance: int, per_packet: bool) -> None:
        if state.next_seq is not None and seq != state.next_seq:
            gap = (seq - state.next_seq) & 0xFFFFFFFF
            if gap < RESTART_WINDOW:
                self.stats.lost += gap
                if per_packet:
                    self.stats.lost_packets_v9 += gap
            elif (state.next_seq - seq) & 0xFFFFFFFF < RESTART_WINDOW:
                self.stats.out_of_order += 1
                return  # a late packet: keep expecting what we expected
        state.next_seq = (seq + advance) & 0xFFFFFFFF

    # -- v5 --------------------------------------------------------------------------------

    def _v5(self, packet: bytes, exporter: str) -> list[Flow]:
        _, count, uptime, secs, nsecs, seq, _etype, engine, sampling = V5_HEADER.unpack_from(packet)
        if len(packet) < V5_HEADER.size + count * V5_RECORD.size:
            self.stats.truncated += 1
            return []
        state = self._domain(exporter, 5, engine)
        if state is None:
            self.stats.templates_refused += 1
            return []
        self._sequence(state, seq, count, per_packet=False)
        rate = (sampling & 0x3FFF) or 1
        now_ms = secs * 1000 + nsecs // 1_000_000
        if self.vectorised:
            a = np.frombuffer(packet, V5_DTYPE, count, V5_HEADER.size)
            return [_Columns(exporter, engine, 5, a, 2, rate, UP, now_ms, uptime)]  # type: ignore[list-item]
        ntoa = socket.inet_ntoa
        flows = []
        end = V5_HEADER.size + count * V5_RECORD.size
        for rec in V5_RECORD.iter_unpack(packet[V5_HEADER.size : end]):
            src, dst, _nh, _i, _o, pkts, octets, first, last, sport, dport, _f, proto = rec[:13]
            flows.append(
                Flow(
                    exporter, engine, 5, ntoa(src), ntoa(dst), sport, dport, proto, octets, pkts,
                    now_ms - ((uptime - first) & 0xFFFFFFFF),
                    now_ms - ((uptime - last) & 0xFFFFFFFF),
                    rate,
                )
            )  # fmt: skip
        return flows

    # -- v9 and IPFIX ----------------------------------------------------------------------

    def _v9(self, packet: bytes, exporter: str) -> list[Flow]:
        _, _count, uptime, secs, seq, source = V9_HEADER.unpack_from(packet)
        state = self._domain(exporter, 9, source)
        if state is None:
            self.stats.templates_refused += 1
            return []
        self._sequence(state, seq, 1, per_packet=True)
        flows: list[Flow | _Columns] = []
        self._sets(packet, V9_HEADER.size, len(packet), state, exporter, source, 9, flows)
        # The v9 header's clock has whole seconds, so secs*1000 - uptime underestimates the
        # boot time by up to a second, differently in each packet. The largest such bound seen
        # is the closest: times then keep their milliseconds instead of jumping by up to 1 s
        # between packets. A bound a second below it means the exporter's clock stepped back.
        boot = secs * 1000 - uptime
        if state.boot_ms is None or boot > state.boot_ms or boot < state.boot_ms - 1000:
            state.boot_ms = boot
        base = (state.boot_ms + uptime, uptime)
        return [self._timed(f, base, state) for f in flows]  # type: ignore[arg-type]

    def _ipfix(self, packet: bytes, exporter: str) -> list[Flow]:
        _, length, export_s, seq, domain = IPFIX_HEADER.unpack_from(packet)
        if length > len(packet) or length < IPFIX_HEADER.size:
            self.stats.truncated += 1
            return []
        state = self._domain(exporter, 10, domain)
        if state is None:
            self.stats.templates_refused += 1
            return []
        flows: list[Flow | _Columns] = []
        self._sets(packet, IPFIX_HEADER.size, length, state, exporter, domain, 10, flows)
        # IPFIX counts data records (options records included) sent before this message.
        self._sequence(state, seq, self._data_records, per_packet=False)
        base = (export_s * 1000, None)
        return [self._timed(f, base, state) for f in flows]  # type: ignore[arg-type]

    def _timed(self, flow: Flow, base: tuple[int, int | None], state: _Domain) -> Flow:
        """Turn the uptime-relative times (a negative marker from _record) into Unix ms."""
        if type(flow) is _Columns:
            return self._timed_columns(flow, base, state)  # type: ignore[return-value]
        if flow.start_ms >= 0:
            return flow
        first, last = -flow.start_ms - 1, -flow.end_ms - 1
        now_ms, uptime = base
        if uptime is not None:
            start, end = (
                now_ms - ((uptime - first) & 0xFFFFFFFF),
                now_ms - ((uptime - last) & 0xFFFFFFFF),
            )
        elif state.system_init_ms is not None:
            start, end = state.system_init_ms + first, state.system_init_ms + last
        else:  # IPFIX sysUpTime without systemInitTimeMilliseconds: the export time is all we know
            start = end = now_ms
        return flow._replace(start_ms=start, end_ms=end)

    def _timed_columns(self, c: _Columns, base: tuple[int, int | None], state: _Domain) -> _Columns:
        """:meth:`_timed` for a data set read by numpy: the packet's clock, kept for
        :meth:`_materialise` (times in s or ms need none)."""
        if c.kind == 2:
            now_ms, uptime = base
            if uptime is not None:
                c.mode, c.p1, c.p2 = UP, now_ms, uptime
            elif state.system_init_ms is not None:
                c.mode, c.p1 = INIT, state.system_init_ms
            else:
                c.mode, c.p1 = NOW, now_ms
        return c

    def _sets(
        self,
        packet: bytes,
        pos: int,
        end: int,
        state: _Domain,
        exporter: str,
        domain: int,
        version: int,
        flows: list[Flow | _Columns],
    ) -> None:
        template_id, options_id = (0, 1) if version == 9 else (2, 3)
        self._data_records = 0
        while pos + 4 <= end:
            set_id, set_len = SET_HEADER.unpack_from(packet, pos)
            if set_len < 4 or pos + set_len > end:
                self.stats.truncated += 1
                return
            body = packet[pos + 4 : pos + set_len]
            pos += set_len
            if set_id == template_id:
                self._templates(body, state, version, options=False)
            elif set_id == options_id:
                self._templates(body, state, version, options=True)
            elif set_id >= 256:
                template = state.templates.get(set_id)
                if template is None:
                    self.stats.unknown_template += 1
                    continue
                self._data(body, template, state, exporter, domain, version, flows)
        if pos != end and end - pos >= 4:
            self.stats.truncated += 1

    def _templates(self, body: bytes, state: _Domain, version: int, options: bool) -> None:
        pos = 0
        while pos + 4 <= len(body):
            tid, count = struct.unpack_from("!HH", body, pos)
            pos += 4
            scope = 0
            if options:
                if version == 9:  # scope and option lengths in bytes
                    scope_len = count
                    if pos + 2 > len(body):
                        break
                    option_len = WORD.unpack_from(body, pos)[0]
                    pos += 2
                    scope, count = scope_len // 4, (scope_len + option_len) // 4
                else:
                    if count == 0 or pos + 2 > len(body):
                        break
                    scope = WORD.unpack_from(body, pos)[0]
                    pos += 2
            if tid < 256:
                self.stats.templates_refused += 1
                return
            if count == 0:  # IPFIX template withdrawal
                state.templates.pop(tid, None)
                continue
            fields = []
            for _ in range(count):
                if pos + 4 > len(body):
                    self.stats.truncated += 1
                    return
                element, length = struct.unpack_from("!HH", body, pos)
                pos += 4
                enterprise = 0
                if version == 10 and element & 0x8000:
                    if pos + 4 > len(body):
                        self.stats.truncated += 1
                        return
                    enterprise = struct.unpack_from("!I", body, pos)[0]
                    element &= 0x7FFF
                    pos += 4
                if version == 9 and length == VARIABLE:
                    self.stats.templates_refused += 1
                    return
                fields.append((element, length, enterprise))
            if tid not in state.templates and len(state.templates) >= MAX_TEMPLATES_PER_DOMAIN:
                self.stats.templates_refused += 1
                continue
            template = Template(fields, is_options=options, scope_count=scope)
            if template.length == 0 and template.struct is not None:
                self.stats.templates_refused += 1  # a record of no bytes would loop for ever
                continue
            state.templates[tid] = template
            self.stats.templates += 1

    def _data(
        self,
        body: bytes,
        t: Template,
        state: _Domain,
        exporter: str,
        domain: int,
        version: int,
        flows: list[Flow | _Columns],
    ) -> None:
        rows: list[dict[int, int | bytes]] | list[tuple[int | bytes, ...]]
        if t.dtype is not None and self.vectorised:
            a = np.frombuffer(body, t.dtype, len(body) // t.length)
            self._data_records += len(a)
            if len(a):
                # The domain's sampling rate as _fast reads it: now, not at the end of the packet.
                kind = t.fast[9]  # type: ignore[index]
                flows.append(_Columns(exporter, domain, version, a, kind, state.sampling))
            return
        if t.struct is not None and t.fast is not None:
            usable = len(body) - len(body) % t.length
            before = len(flows)
            self._fast(body[:usable], t, t.fast, state, exporter, domain, version, flows)
            self._data_records += len(flows) - before
            return
        if t.struct is not None:
            # Padding at the end of a set is shorter than a record (RFC 7011 §3.3.1).
            usable = len(body) - len(body) % t.length
            records = list(t.struct.iter_unpack(body[:usable]))
            index = t.index
            getters = [(e, index[e]) for e in index]
            rows = [{e: rec[i] for e, i in getters} for rec in records]
        else:
            rows = []
            pos = 0
            while pos < len(body):
                try:
                    values, used = _variable_record(t, body, pos)
                except ValueError:
                    if any(body[pos:]):
                        self.stats.truncated += 1
                    break
                rows.append(values)
                pos += used
        self._data_records += len(rows)
        if t.is_options:
            self.stats.options_records += len(rows)
            for row in rows:
                for element in (
                    SAMPLING_INTERVAL,
                    SAMPLER_RANDOM_INTERVAL,
                    SAMPLING_PACKET_INTERVAL,
                ):
                    value = row.get(element)
                    if isinstance(value, int) and value > 0:
                        state.sampling = value
                init = row.get(SYSTEM_INIT_MS)
                if isinstance(init, int):
                    state.system_init_ms = init
            return
        for row in rows:
            flow = self._record(row, t, state, exporter, domain, version)
            if flow is not None:
                flows.append(flow)

    def _fast(
        self,
        body: bytes,
        t: Template,
        plan: tuple[int, ...],
        state: _Domain,
        exporter: str,
        domain: int,
        version: int,
        flows: list[Flow],
    ) -> None:
        isrc, idst, isport, idport, iproto, ibytes, ipkts, ifirst, ilast, kind, isamp = plan
        ntoa = socket.inet_ntoa
        default_rate = state.sampling
        assert t.struct is not None
        for r in t.struct.iter_unpack(body):
            first, last = r[ifirst], r[ilast]
            if kind == 1:
                first, last = first * 1000, last * 1000
            elif kind == 2:  # marked for _timed, as _record does
                first, last = -first - 1, -last - 1
            flows.append(
                Flow(
                    exporter, domain, version, ntoa(r[isrc]), ntoa(r[idst]),
                    r[isport] if isport >= 0 else 0, r[idport] if idport >= 0 else 0,
                    r[iproto] if iproto >= 0 else 0, r[ibytes] if ibytes >= 0 else 0,
                    r[ipkts] if ipkts >= 0 else 0, first, last,
                    (r[isamp] or default_rate) if isamp >= 0 else default_rate,
                )
            )  # fmt: skip

    def _record(
        self,
        row: dict[int, int | bytes],
        t: Template,
        state: _Domain,
        exporter: str,
        domain: int,
        version: int,
    ) -> Flow | None:
        for element in t.wide:
            value = row.get(element)
            if isinstance(value, bytes):
                row[element] = int.from_bytes(value)
        if SRC4 in row and DST4 in row:
            src, dst = socket.inet_ntoa(row[SRC4]), socket.inet_ntoa(row[DST4])  # type: ignore[arg-type]
        elif SRC6 in row and DST6 in row:
            src = socket.inet_ntop(socket.AF_INET6, row[SRC6])  # type: ignore[arg-type]
            dst = socket.inet_ntop(socket.AF_INET6, row[DST6])  # type: ignore[arg-type]
        else:
            return None  # not a flow of addresses (e.g. a MAC-only or options-like record)
        get = row.get
        if START_MS in row and END_MS in row:
            start, end = int(get(START_MS)), int(get(END_MS))  # type: ignore[arg-type]
        elif START_S in row and END_S in row:
            start, end = int(get(START_S)) * 1000, int(get(END_S)) * 1000  # type: ignore[arg-type]
        elif START_US in row and END_US in row:
            start, end = _ntp_ms(get(START_US)), _ntp_ms(get(END_US))
        elif FIRST_UPTIME in row and LAST_UPTIME in row:
            # Uptime-relative: marked negative, resolved by _timed with the header's clock.
            start, end = -int(get(FIRST_UPTIME)) - 1, -int(get(LAST_UPTIME)) - 1  # type: ignore[arg-type]
        else:
            start = end = -1
        sampling = get(SAMPLING_INTERVAL) or get(SAMPLING_PACKET_INTERVAL) or state.sampling
        return Flow(
            exporter, domain, version, src, dst,
            int(get(SPORT, 0)), int(get(DPORT, 0)), int(get(PROTO, 0)),  # type: ignore[arg-type]
            int(get(IN_BYTES, 0)), int(get(IN_PKTS, 0)),  # type: ignore[arg-type]
            start, end, int(sampling),  # type: ignore[arg-type]
        )  # fmt: skip


def _ntp_ms(value: object) -> int:
    """dateTimeMicroseconds (NTP format: seconds since 1900, 2^-32 fractions) → Unix ms."""
    if isinstance(value, bytes):
        value = int.from_bytes(value)
    assert isinstance(value, int)
    return ((value >> 32) - NTP_EPOCH_OFFSET_S) * 1000 + ((value & 0xFFFFFFFF) * 1000 >> 32)


def _variable_record(t: Template, body: bytes, pos: int) -> tuple[dict[int, int | bytes], int]:
    """One record of a template with variable-length fields: its values and its length."""
    start = pos
    for _element, length, _enterprise in t.fields:
        if length == VARIABLE:
            if pos >= len(body):
                raise ValueError("truncated")
            length = body[pos]
            pos += 1
            if length == 255:
                if pos + 2 > len(body):
                    raise ValueError("truncated")
                length = int.from_bytes(body[pos : pos + 2])
                pos += 2
        pos += length
        if pos > len(body):
            raise ValueError("truncated")
    if pos == start:
        raise ValueError("empty record")
    return t.values(body[start:pos]), pos - start


V5_NAMES = ("src", "dst", "pkts", "bytes", "first", "last", "sport", "dport", "proto")
V5_DTYPE = np.dtype(
    {
        "names": list(V5_NAMES),
        "formats": [">u4", ">u4", ">u4", ">u4", ">u4", ">u4", ">u2", ">u2", "u1"],
        "offsets": [0, 4, 16, 20, 24, 28, 32, 34, 38],
        "itemsize": V5_RECORD.size,
    }
)
_U32 = struct.Struct("!I")


UP, INIT, NOW = 1, 2, 3  # how a data set's uptime-relative times become Unix ms (see _timed)


class _Columns:
    """One data set read by numpy: its records (a structured array with the fields ``first``
    and ``last``), what its times are (``kind``: 0 ms, 1 s, 2 uptime), the domain's sampling
    rate when it was read, and, once the packet's clock is known, how to turn uptimes into Unix
    ms (``mode`` with ``p1``, ``p2``)."""

    __slots__ = (
        "domain", "exporter", "kind", "mode", "p1", "p2", "rate", "records", "version",
    )  # fmt: skip

    def __init__(
        self,
        exporter: str,
        domain: int,
        version: int,
        records: np.ndarray,
        kind: int,
        rate: int,
        mode: int = 0,
        p1: int = 0,
        p2: int = 0,
    ) -> None:
        self.exporter, self.domain, self.version = exporter, domain, version
        self.records, self.kind, self.rate = records, kind, rate
        self.mode, self.p1, self.p2 = mode, p1, p2

    def joins(self, other: _Columns) -> bool:
        """Whether this data set can be turned into flows together with ``other``'s."""
        return (
            self.kind == other.kind
            and self.mode == other.mode
            and self.records.dtype == other.records.dtype
        )


def _above(values: np.ndarray, limit: int) -> np.ndarray | bool:
    """Which unsigned values exceed ``limit`` (False at once when their width cannot)."""
    if limit >= 1 << (8 * values.dtype.itemsize):
        return False
    return values > np.uint64(limit)
