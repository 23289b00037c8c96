"""Statistics on measurement series: forecasts, step changes, diurnal patterns."""

from iepm.analysis.series import AnalysisError, Series, parse_series, read_series

__all__ = ["AnalysisError", "Series", "parse_series", "read_series"]
