"""A flow record as the collector, the importer and the archive pass it around.

Its own module so that reading, importing and comparing flows do not load the decoder (and
numpy, which it needs)."""

from __future__ import annotations

from typing import NamedTuple


class Flow(NamedTuple):
    """One flow record as exported (one direction of one connection)."""

    exporter: str
    domain: int
    version: int
    src: str
    dst: str
    sport: int
    dport: int
    proto: int
    bytes: int
    packets: int
    start_ms: int  # Unix time, ms
    end_ms: int
    sampling: int  # 1 in N packets sampled; 1 when unsampled or unknown
