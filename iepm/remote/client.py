"""The monitor's side of the agent API: ask for a slot (waiting politely when busy), release it.

Every request has a deadline; the token is sent only in the Authorization header and never
appears in an error message (errors name the agent URL and the refusal the agent gave).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from iepm.errors import RemoteError
from iepm.remote.access import AgentAccess
from iepm.remote.netns import run_in_netns
from iepm.remote.protocol import (
    Facts,
    Health,
    RunAnswer,
    RunRequest,
    SlotGrant,
    SlotRequest,
    SlotState,
    Usage,
)
from iepm.remote.servers import SERVER_START_TIMEOUT_S
from iepm.remote.trust import read_token

# A release must not be skipped because the probe was cancelled; it gets its own deadline.
RELEASE_TIMEOUT_S = 5.0


class Refusal(RemoteError):
    """The agent said no; ``error`` is its code (limit, busy, unauthorized, ...)."""

    def __init__(self, status: int, body: dict[str, Any], url: str) -> None:
        self.status = status
        self.error = str(body.get("error", "refused"))
        self.limit = body.get("limit")
        self.retry_after_s = body.get("retry_after_s")
        message = str(body.get("message") or body.get("detail") or body)
        super().__init__(f"agent {url} refused ({status} {self.error}): {message}")


class AgentClient:
    """One agent, one monitor credential. ``netns``: make the connections from that network
    namespace (the lab's monitor host)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        netns: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self.netns = netns
        self._verify: ssl.SSLContext | bool = True
        if ca_file is not None or client_cert is not None:
            context = ssl.create_default_context(cafile=ca_file)
            if client_cert is not None:
                context.load_cert_chain(client_cert, client_key)
            self._verify = context

    def __repr__(self) -> str:  # never the token
        return f"AgentClient({self.url!r})"

    @classmethod
    def from_access(cls, access: AgentAccess, netns: str | None = None) -> AgentClient:
        """From a target's ``[targets.agent]`` table."""
        return cls(
            access.url,
            read_token(access.credential_file),
            timeout_s=access.request_timeout_s,
            ca_file=access.ca_file,
            client_cert=access.client_cert,
            client_key=access.client_key,
            netns=netns,
        )

    async def request(
        self,
        method: str,
        path: str,
        json_body: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """(status, JSON body); RemoteError when the agent cannot be reached in time
        (``timeout_s``: this request's deadline, default the client's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s

        async def call() -> tuple[int, dict[str, Any]]:
            async with httpx.AsyncClient(
                base_url=self.url,
                # A longer request (a slot's) still connects within the client's own deadline.
                timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, self.timeout_s)),
                verify=self._verify,
                headers={"Authorization": f"Bearer {self._token}"},
                trust_env=False,
            ) as http:
                response = await http.request(method, path, json=json_body)
                try:
                    body = response.json()
                except ValueError:
                    body = {"message": response.text[:300]}
                return response.status_code, body if isinstance(body, dict) else {"body": body}

        try:
            return await asyncio.wait_for(run_in_netns(self.netns, call), timeout_s + 1.0)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise RemoteError(
                f"agent {self.url} did not answer {method} {path} within {timeout_s:g} s: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        except (httpx.HTTPError, OSError) as exc:
            # Refused connections and TLS failures (an untrusted certificate, none given to an
            # agent that requires one) come at once: say what happened, not "no answer in time".
            raise RemoteError(
                f"agent {self.url}: {method} {path} failed: {type(exc).__name__}: {exc}"
            ) from None

    async def _ok(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        status, answer = await self.request(method, path, body)
        if status >= 300:
            raise Refusal(status, answer, self.url)
        return answer

    async def health(self) -> Health:
        return Health.model_validate(await self._ok("GET", "/v1/health"))

    async def facts(self) -> Facts:
        return Facts.model_validate(await self._ok("GET", "/v1/facts"))

    async def usage(self) -> Usage:
        return Usage.model_validate(await self._ok("GET", "/v1/usage"))

    async def acquire(self, request: SlotRequest, *, wait_s: float = 0.0) -> SlotGrant:
        """A slot with a ready server; while the target is busy, retry as the agent advises
        until ``wait_s`` has passed. Other refusals are raised at once."""
        give_up = time.monotonic() + wait_s
        body = request.model_dump(mode="json")
        while True:
            # The answer comes once the slot's server listens: the agent's start wait on top.
            status, answer = await self.request(
                "POST", "/v1/slots", body, timeout_s=self.timeout_s + SERVER_START_TIMEOUT_S
            )
            if status == 201:
                try:
                    return SlotGrant.model_validate(answer)
                except ValueError as exc:
                    raise RemoteError(
                        f"agent {self.url}: a grant this monitor cannot read: "
                        f"{str(exc).splitlines()[0]}"
                    ) from None
            refusal = Refusal(status, answer, self.url)
            left = give_up - time.monotonic()
            if status != 409 or left <= 0:
                if status == 409:
                    raise RemoteError(f"{refusal} — still busy after waiting {wait_s:g} s")
                raise refusal
            advised = float(refusal.retry_after_s or 1.0)
            # A little jitter so that waiting monitors do not retry in lock-step.
            await asyncio.sleep(min(left, max(0.1, advised) + random.uniform(0.0, 0.2)))

    async def run(self, request: RunRequest) -> RunAnswer:
        """Have the agent's host run one probe (a third-party test); the answer comes when the
        run is over, so the deadline is the run's own plus this client's request timeout.
        Refusal when the agent says no (limits, credential, busy)."""
        status, answer = await self.request(
            "POST",
            "/v1/runs",
            request.model_dump(mode="json"),
            timeout_s=request.deadline_s + self.timeout_s,
        )
        if status >= 300:
            raise Refusal(status, answer, self.url)
        try:
            return RunAnswer.model_validate(answer)
        except ValueError as exc:
            raise RemoteError(
                f"agent {self.url}: a run answer this host cannot read: {str(exc).splitlines()[0]}"
            ) from None

    async def release(self, slot_id: str) -> SlotState:
        return SlotState.model_validate(await self._ok("DELETE", f"/v1/slots/{slot_id}"))

    async def slot(self, slot_id: str) -> SlotState:
        return SlotState.model_validate(await self._ok("GET", f"/v1/slots/{slot_id}"))

    @contextlib.asynccontextmanager
    async def held(self, request: SlotRequest, *, wait_s: float = 0.0) -> AsyncIterator[SlotGrant]:
        """A slot for the duration of the block, always released (also when cancelled)."""
        slot = await self.acquire(request, wait_s=wait_s)
        try:
            yield slot
        finally:
            release = asyncio.ensure_future(self.release(slot.slot_id))
            # Shielded: a cancelled probe still frees the target (the agent's deadline is the
            # backstop if even this fails).
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(release), RELEASE_TIMEOUT_S)
