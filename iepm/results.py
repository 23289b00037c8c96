"""The Result envelope: one run of one probe against one target (schema 1).

Units live in field names (``rtt_avg_ms``, ``throughput_bps``, ``duration_s``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, field_serializer

SCHEMA_VERSION = 1


class Outcome(StrEnum):
    """How a run ended."""

    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"


class Purpose(StrEnum):
    """Why a run was made: the path's routine series, or a tuning/impact study (kept beside
    the routine series, never in its charts, statistics, rollups or alerts)."""

    ROUTINE = "routine"
    STUDY = "study"


def new_result_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """ISO 8601 in UTC with millisecond precision and a ``Z``, as the envelope documents."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class Result(BaseModel):
    """One run of a probe. ``succeeded`` is True only when ``outcome`` is ``ok``."""

    schema_: int = Field(default=SCHEMA_VERSION, alias="schema")
    id: str = Field(default_factory=new_result_id)
    probe: str
    tool: str
    tool_version: str | None = None
    monitor: str
    target: str
    target_address: str | None = None
    started_at: datetime
    duration_s: float = 0.0
    outcome: Outcome = Outcome.OK
    succeeded: bool = True
    error: str | None = None
    diags: str = ""
    raw_token: str | None = None
    purpose: Purpose = Purpose.ROUTINE
    params: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)

    model_config = {"populate_by_name": True}

    @field_serializer("started_at")
    def _serialize_started_at(self, value: datetime) -> str:
        return format_time(value)

    def envelope(self) -> dict[str, Any]:
        """The JSON-ready envelope, with ``schema`` spelled as documented."""
        return self.model_dump(by_alias=True, mode="json")
