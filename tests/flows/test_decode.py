"""The NetFlow v5/v9/IPFIX decoder against packets written by an independent encoder."""

from __future__ import annotations

import struct
from pathlib import Path
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iepm.flows.decode import MAX_TEMPLATES_PER_DOMAIN, Decoder, Flow, Template
from testkit import flow_encoder as enc
from testkit.flow_encoder import F

NOW = 1_795_000_000_000
UPTIME = 3_600_000
EXP = "198.18.0.1"
# A busy 2-core host makes drawing and decoding slow, not wrong.
busy = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

addresses = st.integers(0x0A000000, 0xDFFFFFFF).map(
    lambda n: ".".join(str(b) for b in n.to_bytes(4, "big"))
)


@st.composite
def flows(draw: st.DrawFn) -> F:
    # Within the exporter's uptime (an hour), as a real export is.
    start = draw(st.integers(NOW - UPTIME + 1, NOW))
    return F(
        draw(addresses), draw(addresses), draw(st.integers(0, 65535)), draw(st.integers(0, 65535)),
        draw(st.sampled_from([6, 17])), draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, 2**32 - 1)), start, draw(st.integers(start, NOW)),
    )  # fmt: skip


def expected(f: F, version: int, domain: int = 0, sampling: int = 1) -> Flow:
    return Flow(EXP, domain, version, f.src, f.dst, f.sport, f.dport, f.proto, f.octets, f.pkts,
                f.start_ms, f.end_ms, sampling)  # fmt: skip


@busy
@given(st.lists(flows(), min_size=0, max_size=30), st.integers(0, 2**32 - 1))
def test_v5_roundtrip(records: list[F], seq: int) -> None:
    decoder = Decoder()
    # v5 keeps uptime in ms only: times round-trip exactly relative to the header's clock.
    got = decoder.decode(enc.v5(records, seq=seq, now_ms=NOW, uptime_ms=UPTIME), EXP)
    assert got == [expected(f, 5) for f in records]
    assert decoder.stats.records == len(records)
    assert decoder.stats.truncated == decoder.stats.lost == 0


@busy
@given(
    st.lists(flows(), min_size=1, max_size=30), st.integers(256, 65535), st.integers(0, 2**32 - 1)
)
def test_v9_roundtrip(records: list[F], tid: int, source: int) -> None:
    decoder = Decoder()
    now = NOW - NOW % 1000  # v9's header clock has whole seconds
    records = [f for f in records if f.start_ms <= now and f.end_ms <= now]
    sets = [
        enc.template_set(9, tid, enc.V9_FIELDS),
        enc.data_set(tid, records, enc.V9_FIELDS, now_ms=now, uptime_ms=UPTIME),
    ]
    got = decoder.decode(enc.v9(sets, seq=7, now_ms=now, uptime_ms=UPTIME, source=source), EXP)
    assert got == [expected(f, 9, source) for f in records]
    assert decoder.stats.templates == 1 and decoder.stats.unknown_template == 0


@busy
@given(st.lists(flows(), min_size=1, max_size=30), st.integers(256, 65535), st.integers(1, 8))
def test_ipfix_roundtrip_with_padding(records: list[F], tid: int, pad: int) -> None:
    decoder = Decoder()
    sets = [
        enc.template_set(10, tid, enc.IPFIX_FIELDS),
        enc.data_set(tid, records, enc.IPFIX_FIELDS, now_ms=NOW, pad_to=pad),
    ]
    got = decoder.decode(enc.ipfix(sets, seq=0, now_ms=NOW, domain=3), EXP)
    assert got == [expected(f, 10, 3) for f in records]


@busy
@given(st.binary(max_size=400), st.sampled_from([b"\x00\x05", b"\x00\x09", b"\x00\x0a"]))
def test_garbage_never_raises(tail: bytes, version: bytes) -> None:
    decoder = Decoder()
    decoder.decode(version + tail, EXP)
    assert decoder.stats.packets == 1


@busy
@given(st.lists(flows(), min_size=1, max_size=10), st.data())
def test_truncated_packets_are_counted_not_decoded_in_part(
    records: list[F], data: st.DataObject
) -> None:
    for packet in (
        enc.v5(records, seq=0, now_ms=NOW, uptime_ms=UPTIME),
        enc.ipfix(
            [enc.template_set(10, 300, enc.IPFIX_FIELDS),
             enc.data_set(300, records, enc.IPFIX_FIELDS, now_ms=NOW)],
            seq=0, now_ms=NOW,
        ),
    ):  # fmt: skip
        cut = data.draw(st.integers(0, len(packet) - 1))
        decoder = Decoder()
        got = decoder.decode(packet[:cut], EXP)
        assert got == []
        assert decoder.stats.truncated == 1


def test_data_before_its_template_is_counted_then_read_after_it() -> None:
    decoder = Decoder()
    f = F("198.18.1.2", "198.18.2.2", 40000, 5201, 6, 10_000, 10, NOW - 5000, NOW - 1000)
    data = enc.data_set(400, [f], enc.IPFIX_FIELDS, now_ms=NOW)
    assert decoder.decode(enc.ipfix([data], seq=0, now_ms=NOW), EXP) == []
    assert decoder.stats.unknown_template == 1
    tmpl = enc.template_set(10, 400, enc.IPFIX_FIELDS)
    assert decoder.decode(enc.ipfix([tmpl, data], seq=1, now_ms=NOW), EXP) == [expected(f, 10)]


def test_templates_are_scoped_by_exporter_and_domain() -> None:
    decoder = Decoder()
    f = F("198.18.1.2", "198.18.2.2", 1, 2, 17, 100, 1, NOW - 10, NOW)
    decoder.decode(
        enc.ipfix([enc.template_set(10, 256, enc.IPFIX_FIELDS)], seq=0, now_ms=NOW, domain=1), EXP
    )
    data = enc.data_set(256, [f], enc.IPFIX_FIELDS, now_ms=NOW)
    assert decoder.decode(enc.ipfix([data], seq=0, now_ms=NOW, domain=2), EXP) == []
    assert decoder.decode(enc.ipfix([data], seq=0, now_ms=NOW, domain=1), "198.18.0.9") == []
    assert decoder.stats.unknown_template == 2
    assert len(decoder.decode(enc.ipfix([data], seq=0, now_ms=NOW, domain=1), EXP)) == 1


def test_template_refresh_replaces_the_layout() -> None:
    decoder = Decoder()
    f = F("198.18.1.2", "198.18.2.2", 1, 2, 6, 100, 1, NOW - 2000, NOW)
    seconds = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (150, 4), (151, 4)]
    for fields, start in ((enc.IPFIX_FIELDS, f.start_ms), (seconds, f.start_ms // 1000 * 1000)):
        packet = enc.ipfix(
            [enc.template_set(10, 256, fields), enc.data_set(256, [f], fields, now_ms=NOW)],
            seq=decoder.stats.records, now_ms=NOW,
        )  # fmt: skip
        assert decoder.decode(packet, EXP)[0].start_ms == start
    assert decoder.stats.templates == 2 and decoder.template_count() == 1


def test_template_flood_is_bounded() -> None:
    decoder = Decoder()
    sets = [
        enc.template_set(10, 256 + i, enc.IPFIX_FIELDS)
        for i in range(MAX_TEMPLATES_PER_DOMAIN + 50)
    ]
    for start in range(0, len(sets), 100):
        decoder.decode(enc.ipfix(sets[start : start + 100], seq=0, now_ms=NOW), EXP)
    assert decoder.template_count() == MAX_TEMPLATES_PER_DOMAIN
    assert decoder.stats.templates_refused == 50


def test_sequence_gaps_are_loss_per_protocol() -> None:
    f = F("198.18.1.2", "198.18.2.2", 1, 2, 6, 100, 1, NOW - 2000, NOW)
    decoder = Decoder()
    # v5 counts records: 3 records at seq 0, then seq 10 → 7 records lost.
    decoder.decode(enc.v5([f] * 3, seq=0, now_ms=NOW, uptime_ms=UPTIME), EXP)
    decoder.decode(enc.v5([f] * 3, seq=10, now_ms=NOW, uptime_ms=UPTIME), EXP)
    assert decoder.stats.lost == 7
    # ... and wraps at 2^32.
    decoder = Decoder()
    decoder.decode(enc.v5([f] * 3, seq=2**32 - 2, now_ms=NOW, uptime_ms=UPTIME), EXP)
    decoder.decode(enc.v5([f], seq=1, now_ms=NOW, uptime_ms=UPTIME), EXP)
    assert decoder.stats.lost == 0
    # v9 counts packets.
    decoder = Decoder()
    for seq in (5, 6, 9):
        decoder.decode(enc.v9([], seq=seq, now_ms=NOW, uptime_ms=UPTIME), EXP)
    assert decoder.stats.lost == decoder.stats.lost_packets_v9 == 2
    # A late packet is out of order, not loss, and does not move the expectation back.
    decoder.decode(enc.v9([], seq=7, now_ms=NOW, uptime_ms=UPTIME), EXP)
    decoder.decode(enc.v9([], seq=10, now_ms=NOW, uptime_ms=UPTIME), EXP)
    assert decoder.stats.lost == 2 and decoder.stats.out_of_order == 1


def test_zero_bytes_and_zero_duration_are_counted_and_kept() -> None:
    decoder = Decoder()
    records = [
        F("198.18.1.2", "198.18.2.2", 1, 2, 6, 0, 1, NOW - 1000, NOW),
        F("198.18.1.2", "198.18.2.2", 1, 2, 6, 100, 1, NOW, NOW),
    ]
    assert len(decoder.decode(enc.v5(records, seq=0, now_ms=NOW, uptime_ms=UPTIME), EXP)) == 2
    assert decoder.stats.zero_bytes == 1 and decoder.stats.zero_duration == 1


def test_a_counter_beyond_64_signed_bits_drops_only_its_record(tmp_path: Path) -> None:
    # IPFIX's 8-byte octetDeltaCount can carry up to 2^64 - 1; the archive's columns are signed.
    from iepm.flows.store import add_flows, read_flows
    from iepm.store import Archive

    good = F("198.18.1.2", "198.18.2.2", 1, 2, 6, 100, 1, NOW - 2000, NOW)
    huge = F("198.18.1.2", "198.18.2.2", 3, 4, 6, 2**64 - 1, 1, NOW - 2000, NOW)
    sets = [enc.template_set(10, 256, enc.IPFIX_FIELDS),
            enc.data_set(256, [good, huge, good], enc.IPFIX_FIELDS, now_ms=NOW)]  # fmt: skip
    decoder = Decoder()
    got = decoder.decode(enc.ipfix(sets, seq=0, now_ms=NOW), EXP)
    assert [g.sport for g in got] == [1, 1]
    assert decoder.stats.out_of_range == 1 and decoder.stats.records == 2
    with Archive.open(f"sqlite:///{tmp_path / 'a.db'}") as archive:
        assert add_flows(archive, got, "collector") == 1  # the same record twice is one row
        assert [f.bytes for f in read_flows(archive)] == [100]


def test_options_data_sets_the_sampling_rate() -> None:
    decoder = Decoder()
    # IPFIX options template: scope observationDomainId(149), option samplingPacketInterval(305).
    body = struct.pack(">HHH", 500, 2, 1) + struct.pack(">HHHH", 149, 4, 305, 4)
    options = struct.pack(">HH", 3, len(body) + 4) + body
    data = struct.pack(">HHII", 500, 12, 0, 100)
    f = F("198.18.1.2", "198.18.2.2", 1, 2, 6, 100, 1, NOW - 2000, NOW)
    sets = [options, data, enc.template_set(10, 256, enc.IPFIX_FIELDS),
            enc.data_set(256, [f], enc.IPFIX_FIELDS, now_ms=NOW)]  # fmt: skip
    got = decoder.decode(enc.ipfix(sets, seq=0, now_ms=NOW), EXP)
    assert [g.sampling for g in got] == [100]
    assert decoder.stats.options_records == 1


def test_ipfix_variable_length_and_enterprise_fields() -> None:
    decoder = Decoder()
    # src, dst, an enterprise field of 4 bytes, a variable-length string, octets.
    tmpl = struct.pack(">HH", 256, 5) + struct.pack(">HHHH", 8, 4, 12, 4)
    tmpl += struct.pack(">HHI", 0x8000 | 7, 4, 9999) + struct.pack(">HHHH", 82, 0xFFFF, 1, 8)
    tset = struct.pack(">HH", 2, len(tmpl) + 4) + tmpl
    rec = (
        bytes([198, 18, 1, 2, 198, 18, 2, 2])
        + b"\xff\xff\xff\xff"
        + b"\x03eth"
        + (5000).to_bytes(8, "big")
    )
    long = (
        bytes([198, 18, 1, 3, 198, 18, 2, 2])
        + b"\0\0\0\0"
        + b"\xff\x01\x00"
        + b"x" * 256
        + (7).to_bytes(8, "big")
    )
    dset = struct.pack(">HH", 256, len(rec) + len(long) + 4) + rec + long
    got = decoder.decode(enc.ipfix([tset, dset], seq=0, now_ms=NOW), EXP)
    assert [(g.src, g.bytes, g.sport) for g in got] == [
        ("198.18.1.2", 5000, 0),
        ("198.18.1.3", 7, 0),
    ]


def test_v9_times_keep_their_milliseconds_across_packets() -> None:
    """The v9 header has whole seconds: the decoder keeps the tightest boot time seen."""
    decoder = Decoder()
    boot = NOW - UPTIME  # the exporter's true boot time (NOW is on a whole second)
    got = []
    for fraction_ms in (300, 990, 10):
        true_now = NOW + 5000 + fraction_ms
        uptime = true_now - boot
        f = F("198.18.1.2", "198.18.2.2", 1, 2, 6, 100, 1, true_now - 500, true_now - 20)
        # The encoder's header carries true_now // 1000 seconds; uptime is exact.
        data = enc.data_set(256, [f], enc.V9_FIELDS, now_ms=true_now, uptime_ms=uptime)
        packet = enc.v9([enc.template_set(9, 256, enc.V9_FIELDS), data], seq=fraction_ms,
                        now_ms=true_now, uptime_ms=uptime)  # fmt: skip
        (flow,) = decoder.decode(packet, EXP)
        got.append(flow.start_ms - f.start_ms)
    # Each packet's own header says "up to 1 s early"; the decoder keeps the best bound seen:
    # 300 ms (a 990 ms packet does not make it worse), then 10 ms.
    assert got == [-300, -300, -10]


SECONDS_FIELDS = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (150, 4), (151, 4)]


@busy
@given(
    st.lists(flows(), min_size=1, max_size=20),
    st.sampled_from([(9, enc.V9_FIELDS), (10, enc.IPFIX_FIELDS), (10, SECONDS_FIELDS)]),
)
def test_fast_path_reads_what_the_general_path_reads(
    records: list[F], shape: tuple[int, list[tuple[int, int]]]
) -> None:
    version, fields = shape
    now = NOW - NOW % 1000
    sets = [enc.template_set(version, 256, fields),
            enc.data_set(256, records, fields, now_ms=now, uptime_ms=UPTIME)]  # fmt: skip
    packet = (
        enc.v9(sets, seq=0, now_ms=now, uptime_ms=UPTIME)
        if version == 9
        else enc.ipfix(sets, seq=0, now_ms=now)
    )
    fast = Decoder()
    got = fast.decode(packet, EXP)
    assert all(t.fast is not None for d in fast._domains.values() for t in d.templates.values())
    general = Decoder()
    with patch.object(Template, "_fast_plan", lambda self: None):
        assert general.decode(packet, EXP) == got
    assert fast.stats.records == general.stats.records == len(records)
