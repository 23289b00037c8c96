"""One exception tree for the whole toolkit.

Exceptions are for bugs and bad configuration. A measurement that fails (timeout, unreachable
target, unparsable output) is *data*: the probe returns a Result with ``succeeded=False``.
"""

from __future__ import annotations


class IepmError(Exception):
    """Base of every error iepm raises on purpose."""


class ConfigError(IepmError):
    """A configuration file or option is invalid. The message names file, line and field."""


class ProbeError(IepmError):
    """A probe could not produce a measurement."""


class ProbeTimeout(ProbeError):
    """The tool did not finish before its deadline and was killed."""


class ToolNotFound(ProbeError):
    """The external program is not installed or not on PATH."""


class ToolFailed(ProbeError):
    """The external program ran but reported failure."""


class ParseError(ProbeError):
    """The tool's output could not be understood."""


class RemoteError(IepmError):
    """Talking to an agent or an SSH target failed."""


class StoreError(IepmError):
    """The archive could not be opened, migrated, read or written."""


class LabError(IepmError):
    """The WAN lab could not be built, changed or torn down."""


class AnalysisError(IepmError):
    """A series cannot be analysed: unreadable file, bad rows, too little data."""
