"""The Result envelope cannot hold a contradiction: ``succeeded`` follows ``outcome``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from iepm.results import Outcome, Result

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def fields(**over: Any) -> dict[str, Any]:
    return {
        "probe": "ping",
        "tool": "ping",
        "monitor": "m",
        "target": "t",
        "started_at": T0,
        **over,
    }


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.TIMEOUT, Outcome.SKIPPED])
def test_a_run_that_did_not_end_ok_never_says_it_succeeded(outcome: Outcome) -> None:
    result = Result(**fields(outcome=outcome))
    assert result.succeeded is False
    assert result.envelope()["succeeded"] is False


def test_an_ok_run_succeeded() -> None:
    assert Result(**fields()).succeeded is True


@pytest.mark.parametrize(
    ("outcome", "claimed"), [("failed", True), ("timeout", True), ("skipped", True), ("ok", False)]
)
def test_succeeded_contradicting_outcome_is_refused(outcome: str, claimed: bool) -> None:
    with pytest.raises(ValidationError, match=f"contradicts outcome='{outcome}'"):
        Result(**fields(outcome=outcome, succeeded=claimed))
    envelope = Result(**fields(outcome=outcome)).envelope() | {"succeeded": claimed}
    with pytest.raises(ValidationError, match="contradicts"):
        Result.model_validate_json(json.dumps(envelope))


def test_a_consistent_envelope_round_trips_with_succeeded_where_documented() -> None:
    result = Result(**fields(outcome=Outcome.TIMEOUT, error="killed", data={"packets_sent": 3}))
    envelope = result.envelope()
    keys = list(envelope)
    assert keys[keys.index("outcome") + 1] == "succeeded"
    assert Result.model_validate_json(json.dumps(envelope)) == result
    assert Result(**fields(outcome="failed", succeeded=False)).outcome is Outcome.FAILED


def test_an_envelope_without_outcome_takes_it_from_succeeded() -> None:
    assert Result(**fields(succeeded=False)).outcome is Outcome.FAILED
    assert Result(**fields(succeeded=True)).outcome is Outcome.OK
    with pytest.raises(ValidationError, match="succeeded must be true or false"):
        Result(**fields(succeeded="yes"))


def test_outcome_and_succeeded_cannot_be_changed_apart() -> None:
    result = Result(**fields())
    with pytest.raises(ValidationError, match="frozen"):
        result.outcome = Outcome.FAILED
    with pytest.raises(ValidationError, match="frozen"):
        result.succeeded = False
    # A copy is validated when it touches either: it follows outcome, or is refused.
    assert result.model_copy(update={"outcome": Outcome.FAILED}).succeeded is False
    with pytest.raises(ValidationError, match="contradicts"):
        result.model_copy(update={"outcome": Outcome.FAILED, "succeeded": True})
    assert result.model_copy(update={"error": "x"}).succeeded is True
