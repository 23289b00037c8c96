"""Child process of the concurrency tests: add results to an archive one transaction at a time,
printing each id once its transaction has committed.

    python writer.py URL PREFIX COUNT     (COUNT 0: until killed)

It starts (opens the archive) when a line arrives on stdin, so that several start together.
With a COUNT, it prints "half" after COUNT // 2 results and waits for another line before the
rest: a test holding every writer there knows their writes overlap, however busy the machine.
"""

from __future__ import annotations

import sys
from itertools import count

from iepm.results import Result, utcnow
from iepm.store import Archive


def main() -> None:
    url, prefix, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.stdin.readline()
    with Archive.open(url) as archive:
        for n in count() if total == 0 else range(total):
            result = Result(
                id=f"{prefix}-{n:06d}",
                probe="ping",
                tool="ping",
                monitor=prefix,
                target=f"target-{n % 7}",
                started_at=utcnow(),
                raw_token=f"{prefix}-{n:06d}",
                # Some bulk, so that a kill often lands inside a write.
                diags="x" * 20_000,
                data={"rtts_ms": [float(i) for i in range(500)]},
            )
            archive.add(result)
            print(result.id, flush=True)
            if total and n + 1 == total // 2:
                print("half", flush=True)
                sys.stdin.readline()


if __name__ == "__main__":
    main()
