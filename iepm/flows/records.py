"""A flow record as the collector, the importer and the archive pass it around.

Its own module so that reading, importing and comparing flows do not load the decoder (and
numpy, which it needs)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any, NamedTuple


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


_new_flow = partial(tuple.__new__, Flow)


class FlowColumns:
    """Flow records as columns: one list per :class:`Flow` field, in its order. The collector's
    hot path (decoder → writer → archive) carries these, so no tuple is built per record until
    the archive's row, and a batch grows by one ``extend`` per field."""

    __slots__ = ("columns",)

    def __init__(self, columns: list[list[Any]] | None = None) -> None:
        self.columns = columns if columns is not None else [[] for _ in Flow._fields]

    @classmethod
    def of(cls, flows: Iterable[Flow]) -> FlowColumns:
        return cls([list(column) for column in zip(*flows, strict=True)] or None)

    def __len__(self) -> int:
        return len(self.columns[0])

    def extend(self, other: FlowColumns) -> None:
        for mine, theirs in zip(self.columns, other.columns, strict=True):
            mine += theirs

    def flows(self) -> list[Flow]:
        return list(map(_new_flow, zip(*self.columns, strict=True)))

    def __getitem__(self, part: slice) -> FlowColumns:
        """Records ``part`` (a slice) as columns of their own."""
        return FlowColumns([column[part] for column in self.columns])
