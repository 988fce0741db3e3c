"""The run directory: writer, reader, diagnostics cap.

Layout of ``runs/<run-id>/`` (directories created 0700; secrets redacted in everything written)::

    run.json            RunInfo: config, versions, outcome
    events.jsonl        the full event stream
    terminal.cast       asciinema v2 recording of the harness/exec output
    model_calls.jsonl   one record per model call (written by the recording proxy)
    opencode/stdout.jsonl, opencode/export.json, opencode.db
    stderr.log  cleanup.json  diagnostics.txt  verify/
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field

from core import __version__
from core.events import Event, decode, encode
from core.failures import Outcome
from core.failures.evidence import utcnow
from core.redaction import redact, redact_text

DIAGNOSTICS_CAP = 16_000


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

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()


def make_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


class CastWriter:
    """asciinema v2: a header line, then ``[seconds, "o", text]`` per output chunk."""

    def __init__(self, path: Path, width: int = 120, height: int = 36) -> None:
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
        self._f.write(json.dumps([round(t, 6), code, redact_text(text)]) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


SHELLS_DIR = "shells"  # the casts of shells a person opened in the sandbox


class RunDir:
    """Writer for one run directory. Thread-safe appends; every write is redacted."""

    def __init__(self, path: Path, secrets: tuple[str, ...] = ()) -> None:
        self.path = make_private_dir(path)
        self._secrets = secrets
        self._lock = threading.Lock()
        self._events: TextIO = (self.path / "events.jsonl").open("a", encoding="utf-8")
        self._cast: CastWriter | None = None

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
        with self._lock:
            if self._events.closed:  # a post-mortem shell on a kept sandbox, after the run ended
                self._events = (self.path / "events.jsonl").open("a", encoding="utf-8")
            self._events.write(line + "\n")
            self._events.flush()

    def cast(self) -> CastWriter:
        if self._cast is None:
            self._cast = CastWriter(self.path / "terminal.cast")
        return self._cast

    def shell_cast(self, n: int, width: int, height: int) -> tuple[str, CastWriter]:
        """A new recording for the n-th shell a person opened: (its name in the run dir, the writer)."""
        name = f"{SHELLS_DIR}/shell-{n}.cast"
        make_private_dir(self.path / SHELLS_DIR)
        return name, CastWriter(self.path / name, width, height)

    def write_json(self, name: str, obj: Any) -> Path:
        if isinstance(obj, BaseModel):
            obj = json.loads(obj.model_dump_json())
        return self._atomic(name, json.dumps(redact(obj, self._secrets), indent=2) + "\n")

    def write_text(self, name: str, text: str) -> Path:
        return self._atomic(name, redact_text(text, self._secrets))

    def append_text(self, name: str, text: str) -> None:
        target = self.path / name
        make_private_dir(target.parent)
        with self._lock, target.open("a", encoding="utf-8") as f:
            f.write(redact_text(text, self._secrets))

    def write_run_info(self, info: RunInfo) -> Path:
        return self.write_json("run.json", info)

    def _atomic(self, name: str, text: str) -> Path:
        target = self.path / name
        make_private_dir(target.parent)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target

    def close(self) -> None:
        with self._lock:
            self._events.close()
            if self._cast is not None:
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


def cap_diagnostics(parts: Sequence[tuple[str, str]], cap: int = DIAGNOSTICS_CAP) -> str:
    """Combine named diagnostic parts into at most ``cap`` characters.

    A ``stderr`` part that repeats another part's text is dropped (it is often the same stream
    captured twice). When the whole does not fit, the budget is split evenly across parts; a part
    smaller than its share keeps all of it and leaves the rest to the others; an oversized part
    keeps its head and tail around a truncation marker. Oversized input yields exactly ``cap``.
    """
    texts = [(n, t) for n, t in parts if t]
    kept: list[tuple[str, str]] = []
    for name, text in texts:
        if name.startswith("stderr"):
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
