"""Conveyor's one exception tree.

::

    ConveyorError                 exit 1   anything Conveyor reports as one line and a hint
    +-- ConfigError               exit 2   a wrong key, type or value (names the key path)
    +-- PluginError               exit 2   unknown plugin, conflicting names, missing driver
    +-- PlanningError             exit 2   a strategy the source cannot serve
    +-- ConnectError              exit 3   a server, bucket or file that cannot be reached
    +-- SchemaError               exit 4   a missing table, columns or types that do not map
    +-- TransferError             exit 5   a partition failed while moving rows
    |                                      (``retriable`` says whether a retry may succeed)
    +-- VerificationError         exit 6   source and target disagree after the load
    +-- Cancelled                 exit 130 Ctrl-C / SIGTERM: running partitions rolled back
    +-- JobFailed                 its cause's  a whole run failed: the cause, and the run's report

Every error pickles (the runtimes carry them across processes) and keeps its hint.
Messages never hold secrets: connectors build them from identifiers, never from DSNs.
"""

from __future__ import annotations

from typing import Any


class ConveyorError(Exception):
    """Base of every error Conveyor reports to the user."""

    exit_code = 1
    #: the failed task's traceback (on a Ray worker: its own), shown by --verbose
    task_traceback: str | None = None
    #: the message already says what an append committed
    committed_noted: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[ConveyorError], message: str, state: dict[str, Any]) -> ConveyorError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class ConfigError(ConveyorError):
    """A config key, type or value is wrong; ``key`` is its dotted path."""

    exit_code = 2

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


class PluginError(ConveyorError):
    """A plugin name is unknown, registered twice, or its driver is not installed."""

    exit_code = 2


class PlanningError(ConveyorError):
    """The strategy cannot be served by this source."""

    exit_code = 2


class ConnectError(ConveyorError):
    """A server, bucket or path cannot be reached or authenticated against."""

    exit_code = 3


class SchemaError(ConveyorError):
    """A table or column is missing, or a type cannot map."""

    exit_code = 4


class TransferError(ConveyorError):
    """A partition failed while rows moved.

    ``retriable`` is True for failures a retry may cure (dropped connections, timeouts,
    deadlocks); the runtimes retry only those.
    """

    exit_code = 5

    def __init__(
        self,
        message: str,
        *,
        partition: str | None = None,
        retriable: bool = False,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.partition = partition
        self.retriable = retriable


class VerificationError(ConveyorError):
    """Source and target row counts (or checksums) disagree."""

    exit_code = 6


class Cancelled(ConveyorError):
    """The run was interrupted (SIGINT / SIGTERM); running partitions rolled back."""

    exit_code = 130


class JobFailed(ConveyorError):
    """A run failed (``conveyor.pipelines.run``): ``cause`` is what stopped it, ``report`` the run's
    report as far as it got (None when it failed before a plan existed). Message, hint and exit
    code are the cause's (exit 1 for an error Conveyor did not expect)."""

    def __init__(self, cause: BaseException, report: Any = None) -> None:
        ours = isinstance(cause, ConveyorError)
        super().__init__(cause.message if ours else f"{type(cause).__name__}: {first_line(cause)}",
                         hint=cause.hint if ours else None)
        self.cause = cause
        self.report = report
        self.exit_code = cause.exit_code if ours else 1
        self.task_traceback = cause.task_traceback if ours else None


#: the extra (``pip install 'conveyor[<extra>]'``) that brings each optional top-level module
EXTRAS = {"psycopg": "postgres", "adbc_driver_postgresql": "postgres", "adbc_driver_manager": "postgres", "pgpq": "postgres",
          "duckdb_extension_postgres": "postgres", "pymysql": "mysql", "duckdb_extension_mysql": "mysql", "s3fs": "s3",
          "gcsfs": "gcs", "adlfs": "azure", "ray": "ray", "pandas": "ray-data", "adbc_driver_sqlite": "adbc", "matplotlib": "plot",
          "dagster": "dagster"}


def missing_extra(exc: BaseException) -> PluginError | None:
    """A module of an optional extra that is not installed, as one line naming the extra (None: not one of
    those: a module Conveyor itself should have had is an internal error)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return PluginError(f"the Python package {top!r} is not installed: it comes with Conveyor's {extra!r} extra",
                       hint=f"pip install 'conveyor[{extra}]' (in this environment: {_python()} -m pip install 'conveyor[{extra}]')")


def _python() -> str:
    import sys

    return sys.executable or "python"


def first_line(exc: BaseException) -> str:
    """An exception's message as one line (its type's name where it has none)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def scrub_value(text: str, *secrets: str | None) -> str:
    """Mask each secret where it stands as a whole value (in a URL, after ``=`` or ``:``, in quotes),
    not where its letters happen to stand inside a word: a password ``x`` leaves ``syntax`` alone."""
    import re

    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(secret)}(?![A-Za-z0-9_])", "***", text)
    return text


__all__ = [
    "Cancelled",
    "ConfigError",
    "ConnectError",
    "ConveyorError",
    "PlanningError",
    "PluginError",
    "SchemaError",
    "TransferError",
    "VerificationError",
    "first_line",
    "missing_extra",
    "scrub_value",
]
