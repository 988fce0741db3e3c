"""The run directory: writer, reader, diagnostics cap.

Layout of ``runs/<run-id>/`` (directories created 0700; secrets redacted in everything written
except OpenCode's raw stdout and database, which hold only what the sandbox saw)::

    run.json               RunInfo: config, versions, outcome
    events.jsonl           the full event stream
    terminal.cast          asciinema v2 recording of the harness/exec output
    model_calls.jsonl      one record per model call (written by the recording proxy)
    opencode/stdout.jsonl  OpenCode's stdout, written as it streams in     } whatever happens to
    opencode/stderr.log    its stderr (and the supervisor's), likewise     } the sandbox
    opencode/output.log    the sandbox's copy of that stderr               } after confirmed
    opencode/data/         OpenCode's data directory from the sandbox      } cleanup only
    opencode.db            one consolidated copy of its database           }
    opencode/export.json   the transcript exported from it                 }
    verify/stdout.log, verify/stderr.log    the verifier's output (when it ran)
    build/image.log        the task image's build output (tasks built from a Dockerfile)
    trajectory.json        the run as an ATIF v1.8 trajectory (core/export/atif.py), written last
    diagnostics.txt        failures and logs, redacted, then capped at DIAGNOSTICS_CAP characters

The names of OpenCode's files are in ``core.runtime.opencode`` (STDOUT_FILE, ...).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field

from core import __version__
from core.events import Event, decode, encode
from core.failures import Outcome
from core.failures.evidence import utcnow
from core.invocation import Liveness, invocation_liveness
from core.redaction import redact, redact_text

DIAGNOSTICS_CAP = 16_000
DIAGNOSTICS_FILE = "diagnostics.txt"


class OutcomeSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Outcome
    reward: float | None = None
    failure_kind: str | None = None
    failure_stage: str | None = None
    failure_class: str | None = None
    summary: str = ""


class RunInfo(BaseModel):
    """``run.json``: what ran, with which versions, and how it ended (``outcome`` None while running)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    task_id: str
    task_dir: str | None = None
    attempt: int = 1
    provider: str
    sandbox_id: str | None = None
    sandbox_owned: bool | None = None
    # The sandbox user (name, uid, gid, source) the agent and the shell ran as; the verifier's when
    # it differs (``verify.user: root``).
    sandbox_user: dict[str, Any] | None = None
    verifier_user: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None
    phase: str = "admission"
    phase_durations_s: dict[str, float] = Field(default_factory=dict)
    outcome: OutcomeSummary | None = None
    counts: dict[str, Any] = Field(default_factory=dict)
    # A person used a shell in the sandbox before verification finished (see ShellOpened).
    human_intervened: bool = False
    # The run ended without releasing its sandbox (``--keep-sandbox``/``k``): `opencode-tui attach`
    # reconnects with provider + sandbox_id, `sweep` removes it.
    sandbox_kept: bool = False
    # The process that ran the episode: a run without an outcome whose controller is gone was
    # interrupted (SIGKILL, power loss), not running.
    controller: str | None = None  # core.invocation.invocation_id() of the process that ran it

    @property
    def orphaned(self) -> bool:
        """No outcome, and the controller process is known to be gone."""
        return self.outcome is None and invocation_liveness(self.controller) is Liveness.GONE

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()


def make_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


class CastWriter:
    """asciinema v2: a header line, then ``[seconds, "o", text]`` per output chunk."""

    def __init__(
        self,
        path: Path,
        width: int = 120,
        height: int = 36,
        on_error: Callable[[str, OSError], None] | None = None,
    ) -> None:
        self._on_error = on_error
        self._f: TextIO = path.open("w", encoding="utf-8")
        self._t0 = time.monotonic()
        header = {
            "version": 2,
            "width": width,
            "height": height,
            "timestamp": int(time.time()),
            "env": {"TERM": "xterm-256color"},
        }
        self._f.write(json.dumps(header) + "\n")

    def output(self, text: str, at: float | None = None) -> None:
        self._write("o", text, at)

    def input(self, text: str, at: float | None = None) -> None:
        """What a person typed (asciinema's "i" events), for shells a human used."""
        self._write("i", text, at)

    def _write(self, code: str, text: str, at: float | None) -> None:
        t = time.monotonic() - self._t0 if at is None else at
        try:
            self._f.write(json.dumps([round(t, 6), code, redact_text(text)]) + "\n")
            self._f.flush()
        except OSError as exc:
            if self._on_error is None:
                raise
            self._on_error(self._f.name, exc)

    def close(self) -> None:
        self._f.close()


SHELLS_DIR = "shells"  # the casts of shells a person opened in the sandbox


class RunDir:
    """Writer for one run directory. Thread-safe appends; every write is redacted.

    Once created, writing never raises into the episode: a full or failing disk must not stop the
    sandbox from being closed. The first failure is kept in ``write_error`` and reported through
    ``on_write_error``; what was written before it stays.
    """

    def __init__(self, path: Path, secrets: tuple[str, ...] = ()) -> None:
        self.path = make_private_dir(path)
        self._secrets = secrets
        self._lock = threading.RLock()
        self._events: TextIO = (self.path / "events.jsonl").open("a", encoding="utf-8")
        self._cast: CastWriter | None = None
        self.write_error: str | None = None
        self.on_write_error: Callable[[str], None] | None = None

    def write_failed(self, target: Path | str, exc: OSError) -> None:
        """Note a failed write (the first one is kept and reported)."""
        self.note_write_error(f"cannot write {target}: {exc.strerror or exc}")

    def note_write_error(self, message: str) -> None:
        with self._lock:
            if self.write_error is not None:
                return
            self.write_error = message
        if self.on_write_error is not None:
            self.on_write_error(message)

    @classmethod
    def create(cls, runs_dir: Path, run_id: str, secrets: tuple[str, ...] = ()) -> RunDir:
        make_private_dir(runs_dir)
        return cls(runs_dir / run_id, secrets)

    def sub(self, name: str) -> Path:
        return make_private_dir(self.path / name)

    def append_event(self, event: Event) -> None:
        line = encode(event)
        if self._secrets or _might_hold_secret(line):
            line = json.dumps(redact(json.loads(line), self._secrets), separators=(",", ":"))
        try:
            with self._lock:
                if self._events.closed:  # a post-mortem shell on a kept sandbox, after the run ended
                    self._events = (self.path / "events.jsonl").open("a", encoding="utf-8")
                self._events.write(line + "\n")
                self._events.flush()
        except OSError as exc:
            self.write_failed(self.path / "events.jsonl", exc)

    def cast(self) -> CastWriter:
        if self._cast is None:
            self._cast = CastWriter(self.path / "terminal.cast", on_error=self.write_failed)
        return self._cast

    def shell_cast(self, n: int, width: int, height: int) -> tuple[str, CastWriter]:
        """A new recording for the n-th shell a person opened: (its name in the run dir, the writer)."""
        name = f"{SHELLS_DIR}/shell-{n}.cast"
        make_private_dir(self.path / SHELLS_DIR)
        return name, CastWriter(self.path / name, width, height, on_error=self.write_failed)

    def write_json(self, name: str, obj: Any) -> Path:
        if isinstance(obj, BaseModel):
            obj = json.loads(obj.model_dump_json())
        return self._atomic(name, json.dumps(redact(obj, self._secrets), indent=2) + "\n")

    def write_text(self, name: str, text: str) -> Path:
        return self._atomic(name, redact_text(text, self._secrets))

    def append_text(self, name: str, text: str) -> None:
        target = self.path / name
        try:
            make_private_dir(target.parent)
            with self._lock, target.open("a", encoding="utf-8") as f:
                f.write(redact_text(text, self._secrets))
        except OSError as exc:
            self.write_failed(target, exc)

    def write_diagnostics(self, parts: Sequence[tuple[str, str]], cap: int = DIAGNOSTICS_CAP) -> Path:
        """``diagnostics.txt``: the parts redacted first, then capped, then written as is.

        Redacting after capping would let a short secret replaced by the longer marker push the
        file past the cap, and a cut through a secret could leave a fragment the redaction no
        longer recognises; so the cap sees the text exactly as it is written.
        """
        return self._atomic(DIAGNOSTICS_FILE, cap_diagnostics(parts, cap, secrets=self._secrets))

    def write_run_info(self, info: RunInfo) -> Path:
        return self.write_json("run.json", info)

    def _atomic(self, name: str, text: str) -> Path:
        target = self.path / name
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            make_private_dir(target.parent)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            # The previous complete version (if any) stays; a torn temporary file does not.
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.write_failed(target, exc)
        return target

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(OSError):
                self._events.close()
            if self._cast is not None:
                with contextlib.suppress(OSError):
                    self._cast.close()


_SECRET_HINTS = (
    "uthorization",
    "earer",
    "sk-",
    "api_key",
    "apikey",
    "api-key",
    "token",
    "secret",
    "password",
)


def _might_hold_secret(line: str) -> bool:
    # A cheap pre-check so megabytes of terminal output are not parsed twice when they hold nothing.
    low = line.lower()
    return any(h in low for h in _SECRET_HINTS)


class RunDirReader:
    """Reads a run directory back (for `opencode-tui open`, `runs`, and tests). Lazy by design."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not (self.path / "run.json").exists() and not (self.path / "events.jsonl").exists():
            raise FileNotFoundError(
                f"{self.path} is not a run directory (no run.json or events.jsonl); "
                "list run directories with `opencode-tui runs`"
            )

    def info(self) -> RunInfo | None:
        p = self.path / "run.json"
        return RunInfo.model_validate_json(p.read_text()) if p.exists() else None

    def events(self) -> Iterator[Event]:
        p = self.path / "events.jsonl"
        if not p.exists():
            return
        with p.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield decode(line)

    def model_calls(self) -> Iterator[dict[str, Any]]:
        p = self.path / "model_calls.jsonl"
        if p.exists():
            with p.open(encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield json.loads(line)

    def text(self, name: str) -> str | None:
        p = self.path / name
        return p.read_text(encoding="utf-8", errors="replace") if p.exists() else None


def list_runs(runs_dir: Path) -> list[tuple[Path, RunInfo | None]]:
    """Run directories under ``runs_dir``, newest first; unreadable run.json gives ``None`` info."""
    out: list[tuple[Path, RunInfo | None]] = []
    if not runs_dir.is_dir():
        return out
    for d in runs_dir.iterdir():
        if not d.is_dir() or not ((d / "run.json").exists() or (d / "events.jsonl").exists()):
            continue
        try:
            info = RunInfo.model_validate_json((d / "run.json").read_text())
        except (OSError, ValueError):
            info = None
        out.append((d, info))
    out.sort(key=lambda item: item[0].stat().st_mtime, reverse=True)
    return out


# ---- diagnostics cap -------------------------------------------------------------------------


def _header(name: str) -> str:
    return f"===== {name} =====\n"


def _fit(text: str, budget: int) -> str:
    """``text`` cut to exactly ``budget`` characters: head, a truncation marker, tail."""
    if len(text) <= budget:
        return text
    marker = ""
    for _ in range(3):  # the marker's own length depends on the count it reports
        keep = max(budget - len(marker), 0)
        omitted = len(text) - keep
        marker = f"\n[... {omitted} characters truncated ...]\n"
    keep = budget - len(marker)
    if keep <= 0:
        return text[:budget]
    head = keep - keep // 2
    tail = keep // 2
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def _water_fill(lengths: list[int], total: int) -> list[int]:
    """Split ``total`` evenly; parts needing less than their share give the rest to the others."""
    budgets = [0] * len(lengths)
    remaining = total
    open_parts = sorted(range(len(lengths)), key=lambda i: lengths[i])
    while open_parts:
        share = remaining // len(open_parts)
        i = open_parts[0]
        if lengths[i] <= share:
            budgets[i] = lengths[i]
            remaining -= lengths[i]
            open_parts.pop(0)
            continue
        extra = remaining - share * len(open_parts)
        for n, j in enumerate(open_parts):
            budgets[j] = share + (1 if n < extra else 0)
        break
    return budgets


def cap_diagnostics(
    parts: Sequence[tuple[str, str]], cap: int = DIAGNOSTICS_CAP, secrets: tuple[str, ...] = ()
) -> str:
    """Combine named diagnostic parts into at most ``cap`` characters, secrets already redacted.

    Every name and text is redacted before anything is measured, so the result is final: write it
    without redacting again (a second pass could grow it, e.g. a truncation marker after ``token=``).

    A ``stderr`` part that repeats another part's text is dropped (it is often the same stream
    captured twice). When the whole does not fit, the budget is split evenly across parts; a part
    smaller than its share keeps all of it and leaves the rest to the others; an oversized part
    keeps its head and tail around a truncation marker. Oversized input yields exactly ``cap``.
    """
    texts = [(redact_text(n, secrets), redact_text(t, secrets)) for n, t in parts if t]
    kept: list[tuple[str, str]] = []
    for name, text in texts:
        if posixpath.basename(name).startswith("stderr"):
            stripped = text.strip()
            if any(stripped and stripped in other for n, other in texts if n != name):
                continue
        kept.append((name, text))
    rendered = "".join(_header(n) + t + ("" if t.endswith("\n") else "\n") for n, t in kept)
    if len(rendered) <= cap:
        return rendered
    overhead = sum(len(_header(n)) + 1 for n, _ in kept)  # header + the final newline of each part
    avail = cap - overhead
    if avail <= 0:
        return rendered[:cap]
    budgets = _water_fill([len(t) for _, t in kept], avail)
    out = "".join(_header(n) + _fit(t, b) + "\n" for (n, t), b in zip(kept, budgets, strict=True))
    return out


def versions(opencode_version: str | None = None) -> dict[str, str]:
    import platform

    out = {"opencode_tui": __version__, "python": platform.python_version()}
    if opencode_version:
        out["opencode"] = opencode_version
    return out
