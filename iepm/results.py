"""The Result envelope: one run of one probe against one target (schema 1).

Units live in field names (``rtt_avg_ms``, ``throughput_bps``, ``duration_s``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, field_serializer, model_validator

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
    """One run of a probe. ``succeeded`` is derived from ``outcome`` (True exactly when it is
    ``ok``), so a failed run can never claim success: given on input it must agree with
    ``outcome``, and neither can be assigned afterwards."""

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
    outcome: Outcome = Field(default=Outcome.OK, frozen=True)
    # Always set from outcome by _succeeded_from_outcome (the default is never used).
    succeeded: bool = Field(default=True, frozen=True)
    error: str | None = None
    diags: str = ""
    raw_token: str | None = None
    purpose: Purpose = Purpose.ROUTINE
    params: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)

    model_config = {"populate_by_name": True}

    @model_validator(mode="before")
    @classmethod
    def _succeeded_from_outcome(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        claimed = data.pop("succeeded", None)
        if claimed is not None and not isinstance(claimed, bool):
            raise ValueError(f"succeeded must be true or false (got {claimed!r})")
        if data.get("outcome") is None:
            # No outcome (an envelope that predates it): succeeded is all it says.
            data["outcome"] = Outcome.FAILED if claimed is False else Outcome.OK
        try:
            outcome = Outcome(data["outcome"])
        except ValueError:
            return data  # the outcome field reports its own error
        if claimed is not None and (outcome is Outcome.OK) != claimed:
            raise ValueError(
                f"succeeded={str(claimed).lower()} contradicts outcome={outcome.value!r}"
            )
        data["succeeded"] = outcome is Outcome.OK
        return data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Result:
        """As pydantic's, but a copy that changes ``outcome`` or ``succeeded`` is validated
        (pydantic copies updates unchecked), so no copy can contradict itself either."""
        copy = super().model_copy(update=update, deep=deep)
        if update and {"outcome", "succeeded"} & update.keys():
            return type(self).model_validate(dict(copy) | {"succeeded": update.get("succeeded")})
        return copy

    @field_serializer("started_at")
    def _serialize_started_at(self, value: datetime) -> str:
        return format_time(value)

    def envelope(self) -> dict[str, Any]:
        """The JSON-ready envelope, with ``schema`` spelled as documented."""
        return self.model_dump(by_alias=True, mode="json")
