"""Sizes and rates written as iperf3 writes them (``256K``, ``100M``): a leaf module, so that the
probes, the agent and its config can all read them without importing one another."""

from __future__ import annotations

import re

# iperf3 parses -w with unit_atoi (K = 1024) and -b with unit_atof_rate (K = 1000).
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGkmg]?)$")


def size_bytes(text: str, *, base: int) -> int:
    """``256K`` → 262144 (base 1024) or 256000 (base 1000); ValueError when malformed."""
    match = SIZE_RE.match(text.strip())
    if not match:
        raise ValueError(text)
    scale = {"": 1, "k": base, "m": base**2, "g": base**3}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)
