"""The remote tests' shared agent: one ``iepm agent`` on loopback per module (testkit.agent)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.agent import RunningAgent, running_agent


@pytest.fixture(scope="module")
def loopback_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    with running_agent(tmp_path_factory.mktemp("agent")) as agent:
        yield agent
