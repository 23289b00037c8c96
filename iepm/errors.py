"""One exception tree for the whole toolkit.

Exceptions are for bugs and bad configuration. A measurement that fails (timeout, unreachable
target, unparsable output) is *data*: the probe returns a Result with ``succeeded=False``.
"""

from __future__ import annotations

from enum import IntEnum


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


class UsageError(IepmError):
    """A command-line option or argument is wrong (a date that is not a date, no archive named)."""


class ExitCode(IntEnum):
    """What every ``iepm`` command exits with; the README's table is this one."""

    OK = 0
    FAILED = 1  # the work ran and did not succeed: a measurement failed, a server cannot listen
    USAGE = 2  # bad option, config file, input file or tool output; nothing was done
    STORE = 3  # the archive could not be opened, read or written
    REMOTE = 4  # an agent or SSH target could not be reached or refused
    LAB = 5  # the WAN lab could not be built, changed or torn down
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


# Most specific class first is not needed: exit_code() walks each exception's own MRO.
EXIT_CODES: dict[type[IepmError], ExitCode] = {
    ConfigError: ExitCode.USAGE,
    UsageError: ExitCode.USAGE,
    AnalysisError: ExitCode.USAGE,
    ProbeError: ExitCode.FAILED,
    StoreError: ExitCode.STORE,
    RemoteError: ExitCode.REMOTE,
    LabError: ExitCode.LAB,
}


def exit_code(exc: IepmError) -> ExitCode:
    """The exit code for ``exc``: its nearest class in :data:`EXIT_CODES`."""
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return ExitCode.FAILED
