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
    tokens.jsonl           token ids and logprobs per model call (``model.capture_tokens`` only)
    trajectory.json        the run as an ATIF v1.8 trajectory (core/export/atif.py), written last
    diagnostics.txt        failures and logs, redacted, then capped at DIAGNOSTICS_CAP characters

Every name above is spelled once, in :class:`RunFiles`; :class:`RunDir` writes and
:class:`RunDirReader` reads through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core import __version__
from opencode_tui_core.calls.records import ModelCallRecord, TokenUsage
from opencode_tui_core.calls.token_capture import CapturedTokens, TokenCaptureSummary
from opencode_tui_core.diagnostics import DIAGNOSTICS_CAP, cap_diagnostics
from opencode_tui_core.events import (
    Event,
    FailureRecorded,
    FailureRecovered,
    Intervention,
    OpenCodeEvent,
    ShellOpened,
    decode,
    encode,
)
from opencode_tui_core.failures import Outcome
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.invocation import Liveness, invocation_liveness
from opencode_tui_core.json_text import indented_json
from opencode_tui_core.redaction import could_change, redact, redact_text


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
    # A digest of the workspace before each agent model call (debug.workspace_digests, rerun and fork).
    WORKSPACE_DIGESTS = "workspace_digests.jsonl"
    # Token ids and logprobs, one line per model call that returned them (``model.capture_tokens``,
    # core/calls/token_capture.py); kept apart from model_calls.jsonl so a trainer reads only these.
    TOKENS = "tokens.jsonl"

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


class RunParent(BaseModel):
    """The run a rerun or fork was made from (issue 28)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    run_dir: str


class ReplaySummary(BaseModel):
    """How a rerun or fork went against its parent's record (kept up to date while it runs)."""

    model_config = ConfigDict(extra="forbid")

    replayed: int = 0  # calls answered from the parent's record
    live_from: int | None = None  # the agent step whose call went to the live model first
    reproduced: bool | None = None  # rerun: no divergence (None while running)
    divergence_step: int | None = None
    divergence: str | None = None  # in words, with the recorded call it was compared with
    divergence_diff: str | None = None
    # fork: the workspace at the fork point against the parent's digest (matches / differs / not
    # recorded); rerun: the first step whose workspace differed, if any
    workspace_check: str | None = None
    said: str | None = None  # fork --say: the user message added at the fork point, once it was
    # fork: why it starts before the step asked for (that step's recorded answer was cut or failed)
    fork_moved: str | None = None


# Written only when set, so the run.json of a run that is no rerun or fork is as it was.
LINEAGE_FIELDS = frozenset({"lineage", "parent", "fork_step", "replay", "task_hash"})
# Likewise for the token capture: a run without it writes no ``token_capture``.
_WHEN_SET_FIELDS = LINEAGE_FIELDS | {"token_capture"}


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
    # What a person did through the debugger (issue 27): breaks, continues, says, answers, aborts.
    interventions: list[Intervention] = Field(default_factory=list)
    # The run ended without releasing its sandbox (``--keep-sandbox``/``k``): `opencode-tui attach`
    # reconnects with provider + sandbox_id, `sweep` removes it.
    sandbox_kept: bool = False
    # The process that ran the episode: a run without an outcome whose controller is gone was
    # interrupted (SIGKILL, power loss), not running.
    controller: str | None = None  # opencode_tui_core.invocation.invocation_id() of the process that ran it
    # issue 28: a rerun or fork of ``parent`` (``fork_step``: the agent calls answered from its record)
    task_hash: str | None = (
        None  # the task's content (opencode_tui_core.tasks.task_content_hash) when it started
    )
    lineage: Literal["rerun", "fork"] | None = None
    parent: RunParent | None = None
    fork_step: int | None = None
    replay: ReplaySummary | None = None
    # ``model.capture_tokens``: where the token ids and logprobs are (tokens.jsonl) and how many.
    token_capture: TokenCaptureSummary | None = None

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
        # (A cheap check first: megabytes of terminal output are not parsed twice when they hold nothing.)
        if could_change(line, self._secrets):
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
            obj = obj.model_dump(mode="json")
        text = indented_json(obj)
        if could_change(text, self._secrets):
            text = indented_json(redact(obj, self._secrets))
        return self._atomic(name, text + "\n")

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
        data = info.model_dump(mode="json")
        for name in _WHEN_SET_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return self.write_json(RunFiles.RUN_INFO, data)

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


class RunDirReader:
    """Reads a run directory back: for `opencode-tui open`, `runs`, `attach`, batch, benchmarks and tests.

    Lazy by design: nothing is read until asked for, events and model calls are iterated line by line,
    and a missing file reads as ``None`` (or nothing), never as an error: a run directory of a run that
    was killed, or of an older engine, still opens.
    """

    def __init__(self, path: Path, *, check: bool = True) -> None:
        self.path = Path(path)
        if check and not is_run_dir(self.path):
            raise FileNotFoundError(
                f"{self.path} is not a run directory (no {RunFiles.RUN_INFO} or {RunFiles.EVENTS}); "
                "list run directories with `opencode-tui runs`"
            )

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

    def events(self, *, skip: Collection[str] = (), strict: bool = True) -> Iterator[Event]:
        """Every event in ``events.jsonl``, in order. ``skip``: event types left out before decoding
        (terminal output and OpenCode's raw events are most of a long run). ``strict``: a line that
        does not decode raises; else it is passed over (a torn last line of a live run, an event
        from a newer engine)."""
        markers = [_type_marker(t) for t in skip]
        for _, line in _lines(self.events_path):
            if any(m in line for m in markers):
                continue
            try:
                yield decode(line)
            except ValueError:
                if strict:
                    raise

    def opencode_events(self, event_type: str) -> list[OpenCodeEvent]:
        """OpenCode's raw events of one ``event_type`` (e.g. the serve runner's ``runner.session``),
        without decoding the others: a reader that skips OpenCode's events still gets these few."""
        marker = b'"event_type":"%s"' % event_type.encode()
        out: list[OpenCodeEvent] = []
        for _, line in _lines(self.events_path):
            if marker not in line:
                continue
            try:
                ev = decode(line)
            except ValueError:
                continue
            if isinstance(ev, OpenCodeEvent) and ev.event_type == event_type:
                out.append(ev)
        return out

    def event_records(self, types: Collection[str]) -> list[dict[str, Any]]:
        """The events of ``types`` as plain data, in order, without reading the others: a long run has
        100k events and a handful of failures, so their lines are found in the file's bytes and only
        those are parsed. Plain data: tolerant of a record written by another version (a line that
        does not parse is passed over)."""
        p = self.events_path
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return []
        starts: set[int] = set()
        for marker in (m for t in types for m in (_type_marker(t), _type_marker(t, spaced=True))):
            at = data.find(marker)
            while at >= 0:
                starts.add(data.rfind(b"\n", 0, at) + 1)
                at = data.find(marker, at + 1)
        wanted = set(types)
        out: list[dict[str, Any]] = []
        for start in sorted(starts):
            end = data.find(b"\n", start)
            try:
                ev = json.loads(data[start : end if end >= 0 else len(data)])
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("type") in wanted:  # the marker may sit in a nested object
                out.append(ev)
        return out

    def event_batches(
        self,
        index: EventIndex | None = None,
        batch_size: int = 2000,
        stats: LoadStats | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[list[Event]]:
        """Every event, decoded in batches as the file is streamed (the replay's loader: a run of a
        million events opens at once and loads behind). Lines that do not decode are counted in
        ``stats`` and skipped; ``index`` gets each event's byte offset to read it back later."""
        stats = stats if stats is not None else LoadStats()
        batch: list[Event] = []
        for start, line in _lines(self.events_path, stop):
            try:
                event = decode(line)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                stats.bad_lines += 1
                if len(stats.bad_examples) < 3:
                    stats.bad_examples.append(f"byte {start}: {str(exc).splitlines()[0][:200]}")
                continue
            if index is not None:
                index.offsets.append(start)
            stats.events += 1
            batch.append(event)
            if len(batch) >= batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def failures(self) -> list[FailureRecorded | FailureRecovered]:
        """The failures the run recorded (and those a provider recovered from), in order."""
        return [e for e in self.events() if isinstance(e, FailureRecorded | FailureRecovered)]

    def shells(self) -> list[ShellOpened]:
        """The shells a person opened (each names its cast, ``RunFiles.shell_cast``)."""
        return [e for e in self.events() if isinstance(e, ShellOpened)]

    def shell_casts(self) -> list[Path]:
        return sorted((self.path / RunFiles.SHELLS_DIR).glob("shell-*.cast"))

    # -- model calls -----------------------------------------------------------------------------

    def shell_cast(self, opened: ShellOpened) -> Cast | None:
        """The recording of a person's shell (``shells/shell-N.cast``), None when it is missing."""
        return read_cast(self.path / opened.cast)

    def model_calls(self) -> Iterator[ModelCallRecord]:
        """``model_calls.jsonl``: one record per call, in completion order (records that do not parse,
        e.g. a torn last line of a live run, are skipped)."""
        return self._records(ModelCallRecord)

    def call_summaries(self) -> Iterator[CallSummary]:
        """``model_calls.jsonl`` without the bodies: who asked (kind, message) and the usage of each
        call, in completion order (records that do not parse are skipped). The bodies are nearly all
        of the file's bytes; they are scanned by the JSON parser, never built into Python objects."""
        return self._records(CallSummary)

    def _records(self, model: type[_R]) -> Iterator[_R]:
        for _, line in _lines(self.path / RunFiles.MODEL_CALLS):
            try:
                yield model.model_validate_json(line)
            except ValueError:
                continue

    def captured_tokens(self) -> Iterator[CapturedTokens]:
        """``tokens.jsonl`` (``model.capture_tokens``): each call's token ids and logprobs, in
        completion order; nothing when the capture was off or no call returned token data."""
        for _, line in _lines(self.path / RunFiles.TOKENS):
            try:
                yield CapturedTokens.model_validate_json(line)
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


_R = TypeVar("_R", bound=BaseModel)


def _lines(path: Path, stop: threading.Event | None = None) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of a JSON-lines file with their byte offsets (nothing when there is no
    file); ``stop`` set ends the reading early."""
    if not path.exists():
        return
    offset = 0
    with path.open("rb") as f:
        for line in f:
            start = offset
            offset += len(line)
            if stop is not None and stop.is_set():
                return
            if line.strip():
                yield start, line


def _type_marker(event_type: str, *, spaced: bool = False) -> bytes:
    """How an event's own type reads in its JSON line (a JSON string inside another event escapes its
    quotes, so these bytes occur only as some object's ``type``)."""
    return (b'"type": "%s"' if spaced else b'"type":"%s"') % event_type.encode()


class CallUsage(TokenUsage):
    model_config = ConfigDict(extra="ignore")  # a record of another version still counts


class CallSummary(BaseModel):
    """What counting needs of one ``ModelCallRecord`` (the rest, bodies included, is ignored)."""

    model_config = ConfigDict(extra="ignore")

    call_id: str | None = None
    kind: str | None = None
    message_id: str | None = None
    status: int | None = None
    usage: CallUsage = Field(default_factory=lambda: CallUsage())


class EventIndex:
    """Byte offsets of the events in ``events.jsonl`` (``RunDirReader.event_batches`` fills it): any
    event can be read back on demand.

    Filled by the loader thread while it streams the file; read from the UI thread (appends to an
    ``array`` are atomic under the GIL, and readers only look at indices below ``len``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets = array("q")
        self._cache: OrderedDict[int, Event] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.offsets)

    def event_at(self, index: int) -> Event | None:
        if not 0 <= index < len(self.offsets):
            return None
        with self._lock:
            cached = self._cache.get(index)
            if cached is not None:
                self._cache.move_to_end(index)
                return cached
            with self.path.open("rb") as f:
                f.seek(self.offsets[index])
                line = f.readline()
            try:
                event = decode(line)
            except ValueError:
                return None
            self._cache[index] = event
            if len(self._cache) > 256:
                self._cache.popitem(last=False)
            return event


@dataclass
class LoadStats:
    events: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)


@dataclass
class Cast:
    """An asciinema v2 recording: header and output frames ``(seconds, text)``; what was typed
    (``inputs``, a shell's) and the terminal's size changes (``resizes``, ``(seconds, cols, rows)``)."""

    header: dict[str, Any]
    frames: list[tuple[float, str]]
    inputs: list[tuple[float, str]] = field(default_factory=list)
    resizes: list[tuple[float, int, int]] = field(default_factory=list)

    @property
    def size(self) -> tuple[int, int] | None:
        """The terminal's size at the start (the header's width and height)."""
        w, h = self.header.get("width"), self.header.get("height")
        return (w, h) if isinstance(w, int) and isinstance(h, int) else None

    @property
    def end(self) -> float:
        """The time of the recording's last frame of any kind (a shell may end on what was typed)."""
        return max([self.duration, *(t for t, _ in self.inputs), *(t for t, _, _ in self.resizes)])

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
    inputs: list[tuple[float, str]] = []
    resizes: list[tuple[float, int, int]] = []
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
            if not isinstance(text, str):
                continue
            if kind == "o":
                frames.append((float(t), text))
            elif kind == "i":
                inputs.append((float(t), text))
            elif kind == "r":
                cols, _, rows = text.partition("x")
                if cols.isdigit() and rows.isdigit():
                    resizes.append((float(t), int(cols), int(rows)))
    return Cast(header, frames, inputs, resizes)


# ---- which directories are runs ------------------------------------------------------------------

# A run directory's name as the engine makes it (opencode_tui_core.episode.new_run_id):
# ``<task>-<YYYYmmdd-HHMMSS>-<hex>-a<attempt>``.
RUN_NAME = re.compile(r"^(?P<task>.+)-(?P<stamp>\d{8}-\d{6})-[0-9a-f]{6}-a(?P<attempt>\d+)$")


def is_run_dir(path: Path) -> bool:
    """A run directory holds its run.json or its events.jsonl (the first file a run writes)."""
    return (path / RunFiles.RUN_INFO).exists() or (path / RunFiles.EVENTS).exists()


def run_dir_names(runs_dir: Path) -> list[tuple[str, re.Match[str] | None]]:
    """The run directories directly under ``runs_dir`` (name, and its ``RUN_NAME`` match), unread.

    One ``scandir``: a directory named as the engine names runs has its events.jsonl from its first
    moment, so only the others are looked into (``is_run_dir``); listing 10,000 runs reads no file."""
    out: list[tuple[str, re.Match[str] | None]] = []
    try:
        it = os.scandir(runs_dir)
    except OSError:
        return out
    with it:
        for d in it:
            if not d.is_dir():
                continue
            m = RUN_NAME.match(d.name)
            if m is not None or is_run_dir(Path(d.path)):
                out.append((d.name, m))
    return out


def list_runs(runs_dir: Path) -> list[tuple[Path, RunInfo | None]]:
    """Run directories under ``runs_dir``, newest first; unreadable run.json gives ``None`` info."""
    out = [
        (runs_dir / name, RunDirReader(runs_dir / name, check=False).info_or_none())
        for name, _ in run_dir_names(runs_dir)
    ]
    out.sort(key=lambda item: item[0].stat().st_mtime, reverse=True)
    return out


def versions(opencode_version: str | None = None) -> dict[str, str]:
    import platform

    out = {"opencode_tui": __version__, "python": platform.python_version()}
    if opencode_version:
        out["opencode"] = opencode_version
    return out
