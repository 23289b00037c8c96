"""Sockets in a network namespace, for a monitor whose probes run in one (``monitor.netns``).

Tools are wrapped in ``ip netns exec``; the agent client and the SSH client are Python sockets,
so they are created by a short-lived thread that has joined the namespace (``setns`` changes only
the calling thread, and a socket stays in the namespace it was created in).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from iepm.errors import RemoteError

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _enter(netns: str) -> None:
    path = f"/run/netns/{netns}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise RemoteError(
            f"network namespace {netns!r}: cannot open {path}: {exc.strerror}"
        ) from None
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise RemoteError(f"cannot enter network namespace {netns!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


async def run_in_netns(netns: str | None, make: Callable[[], Awaitable[T]]) -> T:
    """Await ``make()`` with its sockets in ``netns`` (in this loop when ``netns`` is None).

    Inside a namespace it runs on a fresh thread with its own event loop, so no pooled thread
    is left in the namespace."""
    if netns is None:
        return await make()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def deliver(setter: Callable[[], None]) -> None:
        if not done.done():
            setter()

    def main() -> None:
        try:
            _enter(netns)

            async def call() -> T:
                return await make()

            value = asyncio.run(call())
        except BaseException as exc:  # handed to the awaiting task
            error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(deliver, lambda: done.set_exception(error))
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, lambda: done.set_result(value))

    threading.Thread(target=main, name=f"netns-{netns}", daemon=True).start()
    return await done


def connect_in_netns(netns: str, host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP socket connected to ``host:port`` from inside ``netns`` (blocking; for a thread)."""
    result: list[socket.socket] = []
    errors: list[BaseException] = []

    def main() -> None:
        try:
            _enter(netns)
            result.append(socket.create_connection((host, port), timeout=timeout_s))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=main, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if errors:
        raise errors[0]
    if not result:
        raise TimeoutError(f"connecting to {host}:{port} took longer than {timeout_s:g} s")
    sock = result[0]
    sock.setblocking(False)
    return sock
