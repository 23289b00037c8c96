"""The numpy path of the decoder (NetFlow v5, fixed-length v9 / IPFIX templates) against the
per-record path it replaces (``Decoder(vectorised=False)``), on random templates and random record
bytes: the same flows in the same order, and the same counters."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iepm.flows.decode import Decoder, Flow

EXP = "198.18.0.1"
# A busy 2-core host makes drawing slow, not wrong.
relaxed = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TIME_PAIRS = [(152, 153), (150, 151), (22, 21)]  # ms, s, uptime
OTHER = [7, 11, 4, 1, 2, 34, 60, 99, 27]  # ports, proto, counters, sampling, unread ones
WIDTHS = [1, 2, 4, 8]


@st.composite
def templates(draw: st.DrawFn, version: int) -> list[tuple[int, int, int]]:
    """(element, length, enterprise): IPv4 addresses, a time pair and random others, mostly
    fixed widths the numpy path reads, sometimes an odd width or a repeat it must leave alone."""
    first, last = draw(st.sampled_from(TIME_PAIRS))
    fields = [(8, 4, 0), (12, 4, 0), (first, draw(st.sampled_from(WIDTHS)), 0)]
    fields.append((last, draw(st.sampled_from(WIDTHS)), 0))
    for element in draw(st.lists(st.sampled_from(OTHER), max_size=6)):
        width = draw(st.sampled_from([*WIDTHS, 8, 4, 3, 16]))
        enterprise = draw(st.sampled_from([0, 0, 0, 9])) if version == 10 else 0
        fields.append((element, width, enterprise))
    if draw(st.booleans()):
        fields.append((8, draw(st.sampled_from([4, 16])), 0))  # a second source address
    return draw(st.permutations(fields))


def template_set(version: int, tid: int, fields: list[tuple[int, int, int]]) -> bytes:
    body = struct.pack(">HH", tid, len(fields))
    for element, length, enterprise in fields:
        if enterprise:
            body += struct.pack(">HHI", element | 0x8000, length, enterprise)
        else:
            body += struct.pack(">HH", element, length)
    return struct.pack(">HH", 0 if version == 9 else 2, len(body) + 4) + body


def options_set(version: int, tid: int, init_ms: int, sampling: tuple[int, int]) -> bytes:
    """An options template (scope: one 4-byte field) and one record: systemInitTimeMilliseconds
    and a sampling interval of the given width."""
    width, value = sampling
    fields = [(1, 4), (160, 8), (34, width)]
    if version == 9:
        body = struct.pack(">HHH", tid, 4, 4 * (len(fields) - 1))
        set_id = 1
    else:
        body = struct.pack(">HHH", tid, len(fields), 1)
        set_id = 3
    for element, length in fields:
        body += struct.pack(">HH", element, length)
    record = bytes(4) + init_ms.to_bytes(8, "big") + value.to_bytes(width, "big")
    tset = struct.pack(">HH", set_id, len(body) + 4) + body
    return tset + struct.pack(">HH", tid, len(record) + 4) + record


def data_set(tid: int, records: bytes, pad: int) -> bytes:
    return struct.pack(">HH", tid, len(records) + pad + 4) + records + bytes(pad)


def packet(version: int, sets: list[bytes], seq: int, clock: tuple[int, int]) -> bytes:
    uptime, secs = clock
    body = b"".join(sets)
    if version == 9:
        return struct.pack(">HHIIII", 9, len(sets), uptime, secs, seq, 0) + body
    return struct.pack(">HHIII", 10, 16 + len(body), secs, seq, 0) + body


def both(packets: list[bytes]) -> tuple[list[list[Flow]], dict[str, int], Decoder]:
    fast, reference = Decoder(), Decoder(vectorised=False)
    got = [fast.decode(p, EXP) for p in packets]
    want = [reference.decode(p, EXP) for p in packets]
    assert got == want
    assert fast.stats.as_dict() == reference.stats.as_dict()
    together = Decoder()  # a receiver frame's datagrams, decoded in one call
    assert together.decode_many([(p, EXP) for p in packets]) == [f for fs in want for f in fs]
    assert together.stats.as_dict() == reference.stats.as_dict()
    return got, fast.stats.as_dict(), fast


@relaxed
@given(st.sampled_from([9, 10]), st.data())
def test_numpy_path_gives_the_per_record_paths_flows_and_counters(
    version: int, data: st.DataObject
) -> None:
    fields = data.draw(templates(version))
    length = sum(width for _, width, _ in fields)
    tid = data.draw(st.integers(256, 65535))
    clock = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
    packets = []
    for _ in range(data.draw(st.integers(1, 3))):
        count = data.draw(st.integers(0, 6))
        records = data.draw(st.binary(min_size=count * length, max_size=count * length))
        if data.draw(st.booleans()):  # zeros and extremes, which random bytes rarely give
            records = bytes(b if data.draw(st.booleans()) else 0 for b in records)
        sets = [data_set(tid, records, data.draw(st.integers(0, min(3, length - 1))))]
        where = data.draw(st.sampled_from(["before", "after", "none"]))
        if where != "none":  # after: this packet's data is before its template
            sets.insert(0 if where == "before" else 1, template_set(version, tid, fields))
        if data.draw(st.booleans()):
            init = data.draw(st.sampled_from([0, 1_795_000_000_000, 2**63 - 5, 2**64 - 1]))
            width = data.draw(st.sampled_from([4, 8]))
            rate = data.draw(st.sampled_from([0, 1, 100, 2**width - 1]))
            sets.insert(data.draw(st.integers(0, len(sets))),
                        options_set(version, tid ^ 1 | 256, init, (width, rate)))  # fmt: skip
        if data.draw(st.booleans()) and len(sets[-1]) > 4:
            sets[-1] = sets[-1][: data.draw(st.integers(1, len(sets[-1]) - 1))]  # cut short
        packets.append(packet(version, sets, data.draw(st.integers(0, 5)), data.draw(clock)))
    both(packets)


@relaxed
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3)), min_size=1, max_size=4),
       st.data())  # fmt: skip
def test_numpy_v5_gives_the_per_record_paths_flows_and_counters(
    shapes: list[tuple[int, int]], data: st.DataObject
) -> None:
    packets = []
    for count, short in shapes:
        header = struct.pack(
            ">HHIIIIBBH", 5, count, data.draw(st.integers(0, 2**32 - 1)),
            data.draw(st.integers(0, 2**32 - 1)), data.draw(st.integers(0, 999_999_999)),
            data.draw(st.integers(0, 100)), 0, data.draw(st.integers(0, 3)),
            data.draw(st.integers(0, 0xFFFF)),
        )  # fmt: skip
        body = data.draw(st.binary(min_size=48 * count, max_size=48 * count))
        packets.append((header + body)[: len(header) + len(body) - short])
    both(packets)


def test_numpy_path_serves_the_common_shapes() -> None:
    """The property tests above would pass with the numpy path never taken: it is taken for
    v5 and for an all-fixed-length template, and its flows are the encoded ones."""
    fields = [(8, 4, 0), (12, 4, 0), (7, 2, 0), (11, 2, 0), (4, 1, 0), (1, 8, 0), (2, 8, 0),
              (152, 8, 0), (153, 8, 0)]  # fmt: skip
    record = (bytes([198, 18, 0, 7, 198, 19, 0, 1]) + struct.pack(">HHB", 40000, 5201, 6)
              + struct.pack(">QQQQ", 2**63, 7, 1_795_000_000_000, 1_795_000_001_000))  # fmt: skip
    zero = record[:13] + struct.pack(">QQQQ", 0, 1, 1_795_000_000_500, 1_795_000_000_500)
    sets = [template_set(10, 300, fields), data_set(300, record + zero, 2)]
    got, stats, decoder = both([packet(10, sets, 0, (0, 1_795_000_000))])
    assert decoder._domains[(EXP, 10, 0)].templates[300].dtype is not None
    assert got == [[Flow(EXP, 0, 10, "198.18.0.7", "198.19.0.1", 40000, 5201, 6, 0, 1,
                         1_795_000_000_500, 1_795_000_000_500, 1)]]  # fmt: skip
    assert (stats["out_of_range"], stats["zero_bytes"], stats["zero_duration"]) == (1, 1, 1)
    assert stats["records"] == 1
