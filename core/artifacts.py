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
    input/prompt.txt       the prompt exactly as sent to OpenCode (on its stdin)
    input/instructions.md  the instructions file its config names (when the task has one)
    input/task.yaml        the task file the run came from
    shells/shell-N.cast    each shell a person opened in the sandbox
    build/image.log        the task image's build output (tasks built from a Dockerfile)
    trajectory.json        the run as an ATIF v1.8 trajectory (core/export/atif.py), written last
    diagnostics.txt        failures and logs, redacted, then capped at DIAGNOSTICS_CAP characters

Every name above is spelled once, in :class:`RunFiles`; :class:`RunDir` writes and
:class:`RunDirReader` reads through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field

from core import __version__
from core.calls.records import ModelCallRecord
from core.events import Event, FailureRecorded, FailureRecovered, ShellOpened, decode, encode
from core.failures import Outcome
from core.failures.evidence import utcnow
from core.invocation import Liveness, invocation_liveness
from core.redaction import redact, redact_text

DIAGNOSTICS_CAP = 16_000


class RunFiles:
    """The names of the files in a run directory (relative to it): the one place they are spelled."""

    RUN_INFO = "run.json"
    EVENTS = "events.jsonl"
    CAST = "terminal.cast"
    MODEL_CALLS = "model_calls.jsonl"
    DIAGNOSTICS = "diagnostics.txt"
    SHELLS_DIR = "shells"  # the casts of shells a person opened in the sandbox
    # OpenCode's output. stdout and stderr are written as they stream in, so they are there whatever
    # happens to the sandbox; the output log is the sandbox's own copy (the supervisor's messages,
    # OpenCode's and the model relay's stderr), collected after confirmed cleanup only.
    OPENCODE_DIR = "opencode"
    OPENCODE_STDOUT = "opencode/stdout.jsonl"
    OPENCODE_STDERR = "opencode/stderr.log"
    OPENCODE_OUTPUT_LOG = "opencode/output.log"
    OPENCODE_DATA = "opencode/data"
    OPENCODE_EXPORT = "opencode/export.json"
    OPENCODE_DB = "opencode.db"
    # The verifier's output (when it ran).
    VERIFY_STDOUT = "verify/stdout.log"
    VERIFY_STDERR = "verify/stderr.log"
    # What OpenCode was given, exactly as sent into the sandbox.
    PROMPT = "input/prompt.txt"
    INSTRUCTIONS = "input/instructions.md"
    TASK_YAML = "input/task.yaml"
    BUILD_LOG = "build/image.log"  # the task image's build output (tasks built from a Dockerfile)
    TRAJECTORY = "trajectory.json"  # the run as an ATIF trajectory (core/export/atif.py), written last

    @staticmethod
    def shell_cast(n: int) -> str:
        return f"{RunFiles.SHELLS_DIR}/shell-{n}.cast"


# Kept for the modules that import them by these names.
DIAGNOSTICS_FILE = RunFiles.DIAGNOSTICS
SHELLS_DIR = RunFiles.SHELLS_DIR


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
    batch_id: str | None = None  # the batch (``run --batch``) this attempt belongs to
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
    """asciinema v2: a header line (the terminal's size when it opened), then ``[seconds, "o", text]``
    per output chunk, ``"i"`` per input and ``[seconds, "r", "COLSxROWS"]`` per resize."""

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

    def resize(self, cols: int, rows: int, at: float | None = None) -> None:
        """The terminal's new size (asciinema's "r" events): a player redraws at it from here."""
        self._write("r", f"{cols}x{rows}", at)

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
        self._events: TextIO = (self.path / RunFiles.EVENTS).open("a", encoding="utf-8")
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
                    self._events = (self.path / RunFiles.EVENTS).open("a", encoding="utf-8")
                self._events.write(line + "\n")
                self._events.flush()
        except OSError as exc:
            self.write_failed(self.path / RunFiles.EVENTS, exc)

    def cast(self) -> CastWriter:
        if self._cast is None:
            self._cast = CastWriter(self.path / RunFiles.CAST, on_error=self.write_failed)
        return self._cast

    def shell_cast(self, n: int, width: int, height: int) -> tuple[str, CastWriter]:
        """A new recording for the n-th shell a person opened: (its name in the run dir, the writer)."""
        name = RunFiles.shell_cast(n)
        make_private_dir(self.path / RunFiles.SHELLS_DIR)
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
        return self._atomic(RunFiles.DIAGNOSTICS, cap_diagnostics(parts, cap, secrets=self._secrets))

    def write_run_info(self, info: RunInfo) -> Path:
        return self.write_json(RunFiles.RUN_INFO, info)

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
    """Reads a run directory back: for `opencode-tui open`, `runs`, `attach`, batch, benchmarks and tests.

    Lazy by design: nothing is read until asked for, events and model calls are iterated line by line,
    and a missing file reads as ``None`` (or nothing), never as an error: a run directory of a run that
    was killed, or of an older engine, still opens.
    """

    def __init__(self, path: Path | str, *, check: bool = True) -> None:
        self.path = Path(path)
        if check and not self.is_run_dir(self.path):
            raise FileNotFoundError(
                f"{self.path} is not a run directory (no {RunFiles.RUN_INFO} or {RunFiles.EVENTS}); "
                "list run directories with `opencode-tui runs`"
            )

    @staticmethod
    def is_run_dir(path: Path) -> bool:
        return (path / RunFiles.RUN_INFO).exists() or (path / RunFiles.EVENTS).exists()

    def file(self, name: str) -> Path:
        """The path of one of the ``RunFiles`` (it may not exist)."""
        return self.path / name

    # -- run.json --------------------------------------------------------------------------------

    def info(self) -> RunInfo | None:
        """``run.json``; None when there is none. Raises ``ValueError`` when it is unreadable."""
        p = self.path / RunFiles.RUN_INFO
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        return RunInfo.model_validate_json(text)

    def info_or_none(self) -> RunInfo | None:
        """``run.json``, or None when it is missing or unreadable (a listing must go on)."""
        try:
            return self.info()
        except (OSError, ValueError):
            return None

    def info_data(self) -> dict[str, Any]:
        """``run.json`` as plain data, without validation (for readers that tolerate a record written by
        another version). Raises FileNotFoundError / ValueError like ``info``."""
        data = json.loads((self.path / RunFiles.RUN_INFO).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{self.path / RunFiles.RUN_INFO} is not a run record")
        return data

    # -- events ----------------------------------------------------------------------------------

    @property
    def events_path(self) -> Path:
        return self.path / RunFiles.EVENTS

    def events(self) -> Iterator[Event]:
        """Every event in ``events.jsonl``, in order (a line that does not decode raises)."""
        p = self.events_path
        if not p.exists():
            return
        with p.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield decode(line)

    def failures(self) -> list[FailureRecorded | FailureRecovered]:
        """The failures the run recorded (and those a provider recovered from), in order."""
        return [e for e in self.events() if isinstance(e, FailureRecorded | FailureRecovered)]

    def shells(self) -> list[ShellOpened]:
        """The shells a person opened (each names its cast, ``RunFiles.shell_cast``)."""
        return [e for e in self.events() if isinstance(e, ShellOpened)]

    def shell_casts(self) -> list[Path]:
        return sorted((self.path / RunFiles.SHELLS_DIR).glob("shell-*.cast"))

    # -- model calls -----------------------------------------------------------------------------

    def model_calls(self) -> Iterator[ModelCallRecord]:
        """``model_calls.jsonl``: one record per call, in completion order (records that do not parse,
        e.g. a torn last line of a live run, are skipped)."""
        p = self.path / RunFiles.MODEL_CALLS
        if not p.exists():
            return
        with p.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    yield ModelCallRecord.model_validate_json(line)
                except ValueError:
                    continue

    def model_call(self, call_id: str) -> ModelCallRecord | None:
        """The record of ``call_id`` (the last one if repeated), or None. Scans bytes first: only
        lines that mention the id are parsed (the file holds every request body)."""
        p = self.path / RunFiles.MODEL_CALLS
        if not p.exists():
            return None
        needle = call_id.encode()
        found: ModelCallRecord | None = None
        with p.open("rb") as f:
            for line in f:
                if needle not in line:
                    continue
                try:
                    record = ModelCallRecord.model_validate_json(line)
                except ValueError:
                    continue
                if record.call_id == call_id:
                    found = record
        return found

    # -- text files ------------------------------------------------------------------------------

    def text(self, name: str) -> str | None:
        p = self.path / name
        try:
            return p.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, IsADirectoryError):
            return None

    def transcript(self) -> dict[str, Any] | None:
        """OpenCode's exported transcript (``opencode/export.json``), when the run got that far."""
        text = self.text(RunFiles.OPENCODE_EXPORT)
        if text is None:
            return None
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def verifier_output(self) -> tuple[str, str] | None:
        """The verifier's (stdout, stderr), or None when it did not run."""
        out, err = self.text(RunFiles.VERIFY_STDOUT), self.text(RunFiles.VERIFY_STDERR)
        if out is None and err is None:
            return None
        return out or "", err or ""

    def prompt(self) -> str | None:
        return self.text(RunFiles.PROMPT)

    def instructions(self) -> str | None:
        return self.text(RunFiles.INSTRUCTIONS)

    def task_yaml(self) -> str | None:
        return self.text(RunFiles.TASK_YAML)

    def diagnostics(self) -> str | None:
        return self.text(RunFiles.DIAGNOSTICS)

    def cast(self) -> Cast | None:
        return read_cast(self.path / RunFiles.CAST)


@dataclass
class Cast:
    """An asciinema v2 recording: header and output frames ``(seconds, text)`` (input frames dropped)."""

    header: dict[str, Any]
    frames: list[tuple[float, str]]

    @property
    def duration(self) -> float:
        return self.frames[-1][0] if self.frames else 0.0

    @property
    def start_epoch(self) -> float | None:
        ts = self.header.get("timestamp")
        return float(ts) if isinstance(ts, int | float) else None

    def origin(self, run_started: datetime | None = None) -> float | None:
        """Epoch seconds of the recording's time 0.

        asciinema's header ``timestamp`` is whole seconds, up to a second before the true start: mapping
        frames to events with it alone puts the timeline up to a second early. The engine starts the
        recording together with the run, so run.json's ``started_at``, when it falls in that same second,
        supplies the fraction."""
        start = self.start_epoch
        if start is None or run_started is None:
            return start
        precise = run_started.timestamp()
        return precise if start <= precise < start + 1 else start


def read_cast(path: Path) -> Cast | None:
    if not path.exists():
        return None
    header: dict[str, Any] = {}
    frames: list[tuple[float, str]] = []
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline()
        try:
            loaded = json.loads(first)
            header = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            header = {}
        for line in f:
            try:
                t, kind, text = json.loads(line)
            except (ValueError, TypeError):
                continue  # a torn last line of a live recording
            if kind == "o" and isinstance(text, str):
                frames.append((float(t), text))
    return Cast(header, frames)


def list_runs(runs_dir: Path) -> list[tuple[Path, RunInfo | None]]:
    """Run directories under ``runs_dir``, newest first; unreadable run.json gives ``None`` info."""
    out: list[tuple[Path, RunInfo | None]] = []
    if not runs_dir.is_dir():
        return out
    for d in runs_dir.iterdir():
        if not d.is_dir() or not RunDirReader.is_run_dir(d):
            continue
        out.append((d, RunDirReader(d, check=False).info_or_none()))
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
