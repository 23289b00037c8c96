"""The Mathis et al. model: TCP throughput predicted from cheap ping data.

    throughput ≈ MSS / RTT · C / √p        (per stream; × streams for parallel streams)

with p the packet loss probability and C = √(3/2) ≈ 1.22 (Mathis, Semke, Mahdavi, Ott 1997:
periodic loss, an ACK per segment). Here RTT is the median ping RTT and p the pooled ping loss
(received / sent over all pings in the window) — ping sees round-trip loss, the data only the
forward direction's, one of the reasons the model is an estimate.

Each path is flagged: measured ≪ predicted (< ``low``×, host or tuning limited: windows, streams,
CPU), ≈ predicted (loss limited), measured ≫ predicted (> ``high``×: ping's loss is not what the
transfer meets, or a congestion control such as BBR that does not back off on random loss), or
no loss seen (no prediction).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from datetime import datetime
from typing import Any

from iepm.store import Archive

C_PERIODIC = math.sqrt(3 / 2)
DEFAULT_MSS_BYTES = 1448  # 1500-byte MTU less IP, TCP and timestamp option headers


def predict_bps(
    rtt_ms: float, loss_fraction: float, *, c: float = C_PERIODIC, mss: int = DEFAULT_MSS_BYTES
) -> float | None:
    """Mathis throughput of one stream in bit/s (None when no loss was seen)."""
    if loss_fraction <= 0 or rtt_ms <= 0:
        return None
    return mss * 8 / (rtt_ms / 1000) * c / math.sqrt(loss_fraction)


def classify(ratio: float | None, *, low: float = 0.5, high: float = 2.0) -> str:
    if ratio is None:
        return "no loss seen by ping: no prediction"
    if ratio < low:
        return "measured ≪ predicted: host or tuning limited"
    if ratio > high:
        return "measured ≫ predicted: loss not seen by the transfer, or non-Reno congestion control"
    return "measured ≈ predicted: loss limited"


def path_table(
    archive: Archive,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    target: str | None = None,
    c: float = C_PERIODIC,
    mss: int = DEFAULT_MSS_BYTES,
) -> list[dict[str, Any]]:
    """One row per (monitor, target, congestion control): ping RTT and loss over the period,
    the median measured throughput per stream and the Mathis prediction."""
    sent: dict[tuple[str, str], int] = defaultdict(int)
    received: dict[tuple[str, str], int] = defaultdict(int)
    rtts: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in archive.results(probe="ping", target=target, since=since, until=until):
        n_sent = r.data.get("packets_sent")
        if not n_sent:
            continue
        key = (r.monitor, r.target)
        sent[key] += int(n_sent)
        received[key] += int(r.data.get("packets_received") or 0)
        if r.data.get("rtt_avg_ms") is not None:
            rtts[key].append(float(r.data["rtt_avg_ms"]))
    # Throughput per (monitor, target, congestion control): the model describes loss-based
    # (Reno-like) control; BBR is expected to exceed it.
    per_stream: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    streams_used: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for r in archive.results(probe="iperf3", target=target, since=since, until=until):
        data = r.data
        if not r.succeeded or data.get("protocol") == "UDP" or not data.get("throughput_bps"):
            continue
        n = int(data.get("stream_count") or 1)
        ckey = (r.monitor, r.target, str(data.get("congestion") or "unknown"))
        per_stream[ckey].append(data["throughput_bps"] / n)
        streams_used[ckey].append(n)
    keys = set(per_stream) | {
        (m, t, "") for m, t in sent if not any(k[:2] == (m, t) for k in per_stream)
    }
    rows = []
    for full_key in sorted(keys):
        key = full_key[:2]
        loss = (sent[key] - received[key]) / sent[key] if sent[key] else None
        rtt = statistics.median(rtts[key]) if rtts[key] else None
        measured = statistics.median(per_stream[full_key]) if per_stream[full_key] else None
        predicted = predict_bps(rtt, loss, c=c, mss=mss) if rtt and loss is not None else None
        ratio = measured / predicted if measured and predicted else None
        rows.append(
            {
                "monitor": key[0],
                "target": key[1],
                "pings": sent[key],
                "rtt_ms": rtt,
                "loss_percent": None if loss is None else 100 * loss,
                "congestion": full_key[2] or None,
                "iperf3_runs": len(per_stream[full_key]),
                "streams_median": (
                    statistics.median(streams_used[full_key]) if streams_used[full_key] else None
                ),
                "measured_per_stream_bps": measured,
                "predicted_per_stream_bps": predicted,
                "ratio": ratio,
                "verdict": classify(ratio) if measured else "no iperf3 results",
                "c": c,
                "mss_bytes": mss,
            }
        )
    return rows
