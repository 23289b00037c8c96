"""Re-extraction: parse every raw log again with today's parsers and update the archive.

Results are matched to their raw runs by token: a stored result gets the new reading of its own
output (its id, target and parameters stay); a raw run with no stored result (the archive was
lost, or the run predates it) is added.
"""

from __future__ import annotations

from collections import Counter

from pydantic import ValidationError

from iepm.probes import PROBES
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.rawlog import RawLog
from iepm.store import Archive


def extract(raw_log: RawLog, archive_url: str, monitor: str | None = None) -> Counter[str]:
    counts: Counter[str] = Counter(runs=0, updated=0, added=0, failed=0, unknown_probe=0)
    with Archive.open(archive_url) as archive:
        for logged in raw_log.runs():
            counts["runs"] += 1
            module = PROBES.get(logged.probe)
            if module is None:
                counts["unknown_probe"] += 1
                continue
            ctx = ProbeContext(target=logged.target, address="")
            if monitor:
                ctx.monitor = monitor
            # The spec the run had (kept in its raw record) reads the output as it was read.
            try:
                spec = module.Spec.model_validate(logged.params or {})
            except ValidationError:
                spec = module.Spec()
            result = result_from_raw(module, spec, ctx, logged.raw, None)
            result.target_address = None
            stored_id = archive.upsert_by_token(result)
            counts["added" if stored_id == result.id else "updated"] += 1
            if not result.succeeded:
                counts["failed"] += 1
    return counts
