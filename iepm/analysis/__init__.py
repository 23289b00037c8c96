"""Statistics on measurement series: forecasts, step changes, diurnal patterns.

The submodules are imported where used: ``import iepm.analysis.cli`` (every ``iepm`` command
line) must not pay for numpy and scipy.
"""

from typing import Any

__all__ = ["AnalysisError", "Series", "parse_series", "read_series"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from iepm.analysis import series

        return getattr(series, name)
    raise AttributeError(f"module 'iepm.analysis' has no attribute {name!r}")
