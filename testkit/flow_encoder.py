"""An export-packet writer for the tests, written from the RFCs (3954, 7011) and Cisco's v5
layout, independently of iepm.flows.decode (no shared constants or structs)."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class F:
    """A flow to encode; times in Unix ms."""

    src: str
    dst: str
    sport: int
    dport: int
    proto: int
    octets: int
    pkts: int
    start_ms: int
    end_ms: int


def _a4(text: str) -> bytes:
    return ipaddress.IPv4Address(text).packed


def v5(
    flows: list[F], *, seq: int, now_ms: int, uptime_ms: int, engine: int = 0, sampling: int = 0
) -> bytes:
    header = struct.pack(
        ">HHIIIIBBH", 5, len(flows), uptime_ms, now_ms // 1000, (now_ms % 1000) * 1_000_000, seq,
        0, engine, sampling,
    )  # fmt: skip
    body = b""
    for f in flows:
        first = uptime_ms - (now_ms - f.start_ms)
        last = uptime_ms - (now_ms - f.end_ms)
        body += _a4(f.src) + _a4(f.dst) + bytes(4)
        body += struct.pack(">HHIIII", 1, 2, f.pkts, f.octets, first % 2**32, last % 2**32)
        body += struct.pack(">HH", f.sport, f.dport) + b"\x00" + bytes([0x18, f.proto, 0])
        body += struct.pack(">HHBB", 0, 0, 24, 24) + b"\x00\x00"
    return header + body


# (element, length) lists the tests use: the way softflowd writes v9 (uptime times) and a
# millisecond IPFIX template with 8-byte counters.
V9_FIELDS = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (22, 4), (21, 4)]
IPFIX_FIELDS = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]


def _values(f: F, fields: list[tuple[int, int]], *, now_ms: int, uptime_ms: int) -> bytes:
    out = b""
    for element, length in fields:
        if element == 8:
            out += _a4(f.src)
        elif element == 12:
            out += _a4(f.dst)
        else:
            value = {
                7: f.sport, 11: f.dport, 4: f.proto, 1: f.octets, 2: f.pkts,
                22: (uptime_ms - (now_ms - f.start_ms)) % 2**32,
                21: (uptime_ms - (now_ms - f.end_ms)) % 2**32,
                152: f.start_ms, 153: f.end_ms, 150: f.start_ms // 1000, 151: f.end_ms // 1000,
            }.get(element, 0)  # fmt: skip
            out += value.to_bytes(length, "big")
    return out


def _set(set_id: int, body: bytes, pad_to: int = 1) -> bytes:
    pad = (-(len(body) + 4)) % pad_to
    return struct.pack(">HH", set_id, len(body) + 4 + pad) + body + bytes(pad)


def template_set(version: int, tid: int, fields: list[tuple[int, int]]) -> bytes:
    body = struct.pack(">HH", tid, len(fields))
    for element, length in fields:
        body += struct.pack(">HH", element, length)
    return _set(0 if version == 9 else 2, body)


def data_set(
    tid: int,
    flows: list[F],
    fields: list[tuple[int, int]],
    *,
    now_ms: int,
    uptime_ms: int = 0,
    pad_to: int = 4,
) -> bytes:
    body = b"".join(_values(f, fields, now_ms=now_ms, uptime_ms=uptime_ms) for f in flows)
    return _set(tid, body, pad_to)


def v9(
    sets: list[bytes], *, seq: int, now_ms: int, uptime_ms: int, source: int = 0, count: int = 0
) -> bytes:
    return struct.pack(">HHIIII", 9, count, uptime_ms, now_ms // 1000, seq, source) + b"".join(sets)


def ipfix(sets: list[bytes], *, seq: int, now_ms: int, domain: int = 0) -> bytes:
    body = b"".join(sets)
    return struct.pack(">HHIII", 10, 16 + len(body), now_ms // 1000, seq, domain) + body
