"""Alert delivery by webhook: a JSON POST, retried with exponential backoff, in bounded time.

:class:`WebhookSender` posts one payload: up to ``attempts`` tries, each with its own timeout,
waiting ``backoff_s``, 2·``backoff_s``, 4·``backoff_s``… (at most ``max_backoff_s``) between
them, and never longer than ``total_s`` in all. A 2xx answer is delivery. Connection errors,
timeouts, 408, 429 and 5xx are retried; any other answer (a 4xx: the receiver refuses this
payload) ends the round at once, since repeating the same request cannot help.

:class:`Notifier` delivers from a background thread, so a slow or dead receiver never holds up a
measurement cycle, and records every round in the archive (``delivery_attempts`` grows by the
tries made; ``delivered_at`` is set on success). Alerts still undelivered get another round when
:meth:`Notifier.redeliver` is called (the scheduler does so at the start of every cycle), up to
``max_rounds`` rounds in all.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx

from iepm import __version__
from iepm.analysis.alerts import Alert, load_alerts, record_delivery
from iepm.errors import IepmError
from iepm.results import utcnow
from iepm.store import Archive

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Delivery:
    delivered: bool
    attempts: int
    status: int | None  # the last HTTP status, None when no answer came
    error: str | None  # why the last attempt failed
    seconds: float


class WebhookSender:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        attempts: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        total_s: float = 60.0,
        stop: threading.Event | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise IepmError(f"webhook URL {url!r} must start with http:// or https://")
        if attempts < 1 or timeout_s <= 0 or total_s <= 0 or backoff_s < 0:
            raise IepmError("webhook: attempts >= 1, timeout_s > 0, total_s > 0, backoff_s >= 0")
        self.url = url
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.total_s = total_s
        self.stop = stop or threading.Event()

    def send(self, payload: dict[str, object]) -> Delivery:
        body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "User-Agent": f"iepm/{__version__}"}
        status: int | None = None
        error: str | None = None
        tries = 0
        with httpx.Client(follow_redirects=False) as client:
            # The time bound starts once the client is built (its TLS context alone can take
            # seconds on a loaded machine), and the payload is always tried at least once.
            t0 = time.monotonic()
            deadline = t0 + self.total_s
            while tries < self.attempts and not self.stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0.05 and tries > 0:
                    error = f"gave up after {self.total_s:g} s: {error}"
                    break
                tries += 1
                status, error = None, None
                try:
                    response = client.post(
                        self.url,
                        content=body,
                        headers=headers,
                        timeout=min(self.timeout_s, max(remaining, 0.05)),
                    )
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                else:
                    status = response.status_code
                    if 200 <= status < 300:
                        return Delivery(True, tries, status, None, time.monotonic() - t0)
                    error = f"HTTP {status}: {response.text[:200]!r}"
                    if status not in RETRY_STATUS:
                        break  # the receiver refuses this request; repeating it cannot help
                if tries < self.attempts:
                    wait = min(self.backoff_s * 2 ** (tries - 1), self.max_backoff_s)
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                    if self.stop.wait(wait):
                        break
        if self.stop.is_set() and error is None:
            error = "stopped before delivery"
        return Delivery(False, tries, status, error, time.monotonic() - t0)


class Notifier:
    """Delivers alerts by webhook from one background thread and records each round."""

    def __init__(self, archive: Archive, sender: WebhookSender, *, max_rounds: int = 3) -> None:
        self.archive = archive
        self.sender = sender
        self.max_rounds = max_rounds
        self._queue: queue.Queue[Alert | None] = queue.Queue()
        self._lock = threading.Condition()
        self._in_flight: set[str] = set()
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.failed_rounds = 0

    @property
    def max_attempts(self) -> int:
        return self.sender.attempts * self.max_rounds

    def submit(self, alert: Alert) -> bool:
        """Queue an alert for delivery; False when it is already queued or being delivered."""
        with self._lock:
            if alert.id in self._in_flight:
                return False
            self._in_flight.add(alert.id)
            if self._thread is None or not self._thread.is_alive():
                self.sender.stop.clear()
                self._thread = threading.Thread(target=self._work, name="iepm-webhook", daemon=True)
                self._thread.start()
        self._queue.put(alert)
        return True

    def redeliver(self, monitor: str, *, within: timedelta = timedelta(days=1)) -> int:
        """Queue this monitor's undelivered recent alerts that have rounds left; how many."""
        pending = load_alerts(
            self.archive,
            monitor=monitor,
            since=utcnow() - within,
            undelivered=True,
            max_attempts=self.max_attempts,
        )
        return sum(self.submit(a) for a in pending)

    def drain(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until nothing is queued or in delivery."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Let queued deliveries finish for up to ``timeout_s``, then stop the thread."""
        self.drain(timeout_s)
        self.sender.stop.set()
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=max(1.0, self.sender.timeout_s + 1.0))
            self._thread = None

    def _work(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            try:
                self._deliver(alert)
            except Exception:  # a bug here must not kill the delivery thread
                log.exception("delivering alert %s failed", alert.id)
            finally:
                with self._lock:
                    self._in_flight.discard(alert.id)
                    self._lock.notify_all()

    def _deliver(self, alert: Alert) -> None:
        outcome = self.sender.send(alert.payload())
        delivered_at: datetime | None = utcnow() if outcome.delivered else None
        if outcome.delivered:
            self.delivered += 1
        else:
            self.failed_rounds += 1
            log.warning(
                "alert %s not delivered to %s after %d attempt(s): %s",
                alert.id,
                self.sender.url,
                outcome.attempts,
                outcome.error,
            )
        if outcome.attempts:
            record_delivery(
                self.archive, alert.id, attempts=outcome.attempts, delivered_at=delivered_at
            )
