"""Archive calls with a wall-clock deadline, off the event loop.

A database can hang in ways no driver timeout sees: a PostgreSQL frozen by SIGSTOP still has its
kernel acknowledge every packet, so neither TCP keepalives nor ``tcp_user_timeout`` fire, and its
``statement_timeout`` is enforced by the very process that is stopped. So the monitor never calls
the archive on its event loop: each call runs on one worker thread, and the loop waits for it at
most ``deadline_s``. A call that outlives its deadline is abandoned (it may still finish later —
which is why spooled writes are idempotent); calls queued behind it that have not started yet
are cancelled when their own deadlines pass.

The worker is a daemon thread: a call stuck in a frozen database cannot keep ``iepm run`` from
exiting.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class ArchiveDeadline(TimeoutError):
    """An archive call did not finish within its deadline (it was abandoned)."""


class Guard:
    """Runs callables on one daemon thread, awaited with a deadline."""

    def __init__(self, name: str = "iepm-archive") -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue  # abandoned before it started
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the waiter, whoever it is
                future.set_exception(exc)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, fn, args))
        return future

    async def call(self, deadline_s: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker thread; ``ArchiveDeadline`` after ``deadline_s``."""
        future = self.submit(fn, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), deadline_s)
        except TimeoutError:
            future.cancel()  # if it has not started; a running call is left to finish
            name = getattr(fn, "__qualname__", repr(fn))
            raise ArchiveDeadline(f"{name} took longer than {deadline_s:g} s") from None

    def busy(self) -> bool:
        """Whether calls are waiting (e.g. behind one stuck in a frozen database)."""
        return not self._jobs.empty()

    def close(self) -> None:
        """Let the worker end after the calls queued so far (it is not waited for)."""
        self._jobs.put(None)
