"""The process's exit codes: stable, documented in the README's table."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # every episode scored
    MODEL_FAILURE = (
        1  # some episode failed on the model side (counted as zero), none on the infrastructure side
    )
    USAGE = 2  # usage or configuration error; or the provider refused the request as configured
    INFRA = 3  # infrastructure or unknown failure
    CLEANUP_UNCONFIRMED = 4  # a sandbox may still hold processes
    HANGUP = 129  # SIGHUP (after cleanup and release)
    INTERRUPTED = 130  # Ctrl-C / SIGINT, or cancelled in the TUI (after cleanup and release)
    TERMINATED = 143  # SIGTERM (after cleanup and release)
    PIPE_CLOSED = 141  # stdout's reader went away (`| head`): the output stopped there, quietly

    @classmethod
    def for_cancel(cls, by: str | None) -> ExitCode:
        """The exit code of a run cancelled by ``by`` (a signal name, or the user)."""
        return {"SIGTERM": cls.TERMINATED, "SIGHUP": cls.HANGUP}.get(by or "", cls.INTERRUPTED)

    @property
    def severity(self) -> int:
        """Which code a batch reports when its episodes differ: the most severe one."""
        return _SEVERITY[self]


_SEVERITY = {
    ExitCode.OK: 0,
    ExitCode.MODEL_FAILURE: 1,
    ExitCode.INFRA: 2,
    ExitCode.CLEANUP_UNCONFIRMED: 3,
    ExitCode.USAGE: 4,
    ExitCode.INTERRUPTED: 5,
    ExitCode.HANGUP: 5,
    ExitCode.TERMINATED: 5,
    ExitCode.PIPE_CLOSED: 5,
}
