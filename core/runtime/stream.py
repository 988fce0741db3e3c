"""OpenCode's machine-readable stdout turned into engine events and the terminal a person would have seen.

Two sources, one contract (``feed``/``close``, ``finished_cleanly``, ``last_error``,
``rejected_permissions``):

- :class:`ServeStreamTranslator` reads the server event stream relayed by ``serve_runner.py``: a running
  bash command's output appears as it is produced, assistant text as it is generated;
- :class:`RunStreamTranslator` reads ``opencode run --format json``, where a tool call appears only once
  it has finished and text only once its part has ended.

The rendering is emitted on the ``display`` stream (it is what ``terminal.cast`` records and what the TUI
shows); the first display chunk of a run is a header (for ``serve``: the server starting), so a viewer
knows from the start that the engine renders the transcript.

This module is the one renderer: the translators and :class:`EventRenderer` (which renders tool calls and
OpenCode events recorded without a ``display`` rendering, e.g. by an older engine) share ``render_tool``,
``bash_prompt``, ``render_text`` and ``render_error``; the TUI shows what they produce.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.events import Event, FaultKind, OpenCodeEvent, SandboxFault, TerminalOutput, ToolCall
from opencode_tui_core.runtime.transcript import compaction_trigger
from opencode_tui_core.sandbox.base import describe_exit

DIFF_LINES = 12  # a "short diff": at most this many changed lines per edit
TOOL_OUTPUT_CAP = 20_000
# OpenCode's live copy of a command's output: at most this many characters, after this mark.
LIVE_WINDOW = 30_000
LIVE_WINDOW_MARK = "...\n\n"
OVERLAP_ANCHOR = 64

RESET = "\x1b[0m"
BOLD = "\x1b[1m"
DIM = "\x1b[2m"
DIM_ITALIC = "\x1b[2;3m"
RED = "\x1b[31m"
GREEN = "\x1b[32m"
YELLOW = "\x1b[33m"
CYAN = "\x1b[36m"
PROMPT = "\x1b[1;32m"


# ``opencode run`` (1.18.32) reports a permission it auto-rejects on its stderr, which the supervisor
# appends to output.log: ``! permission requested: external_directory (/etc/*); auto-rejecting``.
RUN_REJECTION = re.compile(r"permission requested: (?P<permission>\S+) \((?P<patterns>.*)\); auto-rejecting")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def display(text: str) -> TerminalOutput:
    return TerminalOutput(stream="display", data=text)


class RejectedPermission(BaseModel):
    """A permission OpenCode asked for and nobody could grant (the runner, or ``opencode run``, rejected
    it). OpenCode ends the turn after a rejection, so this is usually why a run did not finish."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    permission: str  # e.g. ``external_directory``, ``doom_loop``, ``read`` (a ``.env`` file)
    patterns: list[str] = Field(default_factory=list)  # what it was for, e.g. ``/etc/*``
    metadata: dict[str, Any] = Field(default_factory=dict)  # e.g. ``filepath`` (serve only)
    call_id: str | None = None  # the tool call that asked (serve only)
    session_id: str | None = None  # the session (or sub-agent session) that asked (serve only)

    def describe(self) -> str:
        """``external_directory`` for /etc/* (/etc/hostname): one line for messages and the display."""
        where = f" for {', '.join(self.patterns)}" if self.patterns else ""
        path = self.metadata.get("filepath")
        return f"`{self.permission}`{where}" + (f" ({path})" if isinstance(path, str) and path else "")


class _Translator:
    """Line splitting, the shared state and the rendering of finished tool calls."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir.rstrip("/")
        self._buf = b""
        self.finished_cleanly = False
        self.last_error: str | None = None
        self.rejected_permissions: list[RejectedPermission] = []
        # Shell commands the kernel killed while they ran: call id -> what happened, said at their end.
        self._killed: dict[str, str] = {}

    def fault(self, fault: SandboxFault, when: str) -> list[Event]:
        """A kernel kill or a full disk seen live (``when``: ``+m:ss`` into the episode): one line now,
        and, for a kill during a shell command, a note at that command's end (OpenCode may report it
        as a timeout)."""
        if fault.tool_call_id and fault.kind is FaultKind.OOM_KILL:
            pid = f" (pid {fault.pid})" if fault.pid is not None else ""
            self._killed[fault.tool_call_id] = f"the kernel had OOM-killed this command at {when}{pid}"
        return [display(styled(BOLD + RED, f"⚠ {when} {fault.message}") + "\n")]

    def _fault_note(self, call: ToolCall) -> list[Event]:
        what = self._killed.pop(call.call_id, None)
        if what is None:
            return []
        later = "; OpenCode's timeout note came later" if "exceeding timeout" in (call.output or "") else ""
        return [display(styled(BOLD + RED, f"⚠ {what}{later}") + "\n")]

    def feed(self, data: bytes) -> list[Event]:
        self._buf += data
        out: list[Event] = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            out += self._parse(line)
        return out

    def close(self) -> list[Event]:
        rest, self._buf = self._buf, b""
        return self._parse(rest) if rest.strip() else []

    def _parse(self, line: bytes) -> list[Event]:
        try:
            obj = json.loads(line)
        except ValueError:
            text = line.decode("utf-8", "replace")
            return [display(text + "\n")] if text.strip() else []
        return self._event(obj) if isinstance(obj, dict) else []

    def _event(self, obj: dict[str, Any]) -> list[Event]:
        raise NotImplementedError

    def _rejected(self, rejected: RejectedPermission) -> None:
        self.rejected_permissions.append(rejected)
        # OpenCode ends the turn after a rejection: if the run fails, this is why.
        self.last_error = (
            f"OpenCode asked for permission {rejected.describe()}; nobody can answer, so it was rejected"
        )

    def feed_log(self, text: str) -> None:
        """OpenCode's stderr log, once collected. Nothing to take from it by default: the serve runner
        reports rejected permissions on stdout; ``opencode run`` only on stderr (see its override)."""
        del text

    def _error(self, message: Any) -> list[Event]:
        self.last_error = str(message)[:2000]
        self.finished_cleanly = False
        return [display(render_error(self.last_error))]

    def _tool_call(self, part: dict[str, Any]) -> ToolCall:
        state = part.get("state") or {}
        status = state.get("status", "completed")
        output = state.get("error") if status == "error" else state.get("output")
        if output is None and status == "error":
            output = state.get("output")
        inp = state.get("input")
        metadata = v if isinstance(v := state.get("metadata"), dict) else {}
        exit_code = metadata.get("exit")
        times = v if isinstance(v := state.get("time"), dict) else {}
        start, end = times.get("start"), times.get("end")
        took: float | None = None
        if isinstance(start, int | float) and isinstance(end, int | float) and not isinstance(start, bool):
            took = max(end - start, 0) / 1000  # OpenCode's times are in ms
        return ToolCall(
            call_id=str(part.get("callID") or part.get("id") or ""),
            tool=str(part.get("tool", "unknown")),
            status="error" if status == "error" else ("running" if status == "running" else "completed"),
            title=state.get("title"),
            input=inp if isinstance(inp, dict) else {},
            output=str(output)[:TOOL_OUTPUT_CAP] if output is not None else None,
            message_id=part.get("messageID"),
            exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
            duration_s=took,
        )

    def render_tool(self, call: ToolCall) -> str:
        return render_tool(call, self.workdir)


def render_tool(call: ToolCall, workdir: str = "") -> str:
    """A finished call as a person would have seen it: a prompt line and output, a short diff, or a line."""
    inp, out = call.input, call.output or ""
    if call.tool == "bash":
        return bash_prompt(str(inp.get("command", ""))) + _ended(out)
    path = _rel(str(inp.get("filePath", inp.get("path", ""))), workdir)
    if call.status != "error" and call.tool == "edit":
        old = str(inp.get("oldString", "")).splitlines()[:DIFF_LINES]
        new = str(inp.get("newString", "")).splitlines()[:DIFF_LINES]
        diff = [f"{BOLD}--- {path}{RESET}", f"{BOLD}+++ {path}{RESET}"]
        diff += [f"{RED}-{line}{RESET}" for line in old] + [f"{GREEN}+{line}{RESET}" for line in new]
        return "\n".join(diff) + "\n"
    if call.status != "error" and call.tool == "write":
        lines = str(inp.get("content", "")).splitlines()
        shown = "\n".join(f"{GREEN}+{line}{RESET}" for line in lines[:DIFF_LINES])
        more = f"\n… {len(lines) - DIFF_LINES} more lines" if len(lines) > DIFF_LINES else ""
        return f"{BOLD}+++ {path}{RESET} (new, {len(lines)} lines)\n{shown}{more}\n"
    mark = "✖" if call.status == "error" else "•"
    detail = path or json.dumps(inp)[:200]
    extra = f": {out.strip()[:300]}" if call.status == "error" else ""
    return f"{DIM}{mark} {call.tool} {detail}{extra}{RESET}\n"


def _rel(path: str, workdir: str) -> str:
    workdir = workdir.rstrip("/")
    return path[len(workdir) + 1 :] if workdir and path.startswith(workdir + "/") else path


def render_text(text: str) -> str:
    """The assistant's text of a finished part (``opencode run``)."""
    return f"{CYAN}{text}{RESET}\n"


def render_error(message: str) -> str:
    return f"{RED}✖ {message}{RESET}\n"


def styled(style: str, text: str) -> str:
    """Each line styled on its own: the terminal pane decodes line by line."""
    return "\n".join(f"{style}{line}{RESET}" if line else "" for line in text.split("\n"))


def styled_part(kind: str, text: str) -> str:
    """Streamed assistant text (cyan) or reasoning (dim italic)."""
    return styled(DIM_ITALIC if kind == "reasoning" else CYAN, text)


def bash_prompt(command: str) -> str:
    lines = command.splitlines() or [""]
    head = f"{PROMPT}${RESET} {BOLD}{lines[0]}{RESET}\n"
    return head + "".join(f"{PROMPT}>{RESET} {BOLD}{line}{RESET}\n" for line in lines[1:])


def _ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


class RunStreamTranslator(_Translator):
    """``opencode run --format json`` lines → OpenCodeEvent, ToolCall and display text."""

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self._headed = False

    def feed_log(self, text: str) -> None:
        for line in text.splitlines():
            found = RUN_REJECTION.search(ANSI.sub("", line))
            if found:
                patterns = [p for p in found.group("patterns").split(", ") if p]
                self._rejected(RejectedPermission(permission=found.group("permission"), patterns=patterns))

    def _event(self, obj: dict[str, Any]) -> list[Event]:
        etype = str(obj.get("type", "unknown"))
        events: list[Event] = [OpenCodeEvent(event_type=etype, payload=obj)]
        part = obj.get("part") or {}
        if not self._headed:
            self._headed = True
            events.insert(0, display(f"{DIM}● opencode run (tool calls appear when they finish){RESET}\n"))
        if etype == "tool_use":
            call = self._tool_call(part)
            events += [call, display(self.render_tool(call)), *self._fault_note(call)]
        elif etype == "text" and not part.get("synthetic"):
            text = str(part.get("text", "")).rstrip()
            if text:
                events.append(display(render_text(text)))
        elif etype == "step_finish":
            self.finished_cleanly = part.get("reason") == "stop"
        elif etype == "error":
            err = obj.get("error") or {}
            msg = (err.get("data") or {}).get("message") if isinstance(err, dict) else None
            events += self._error(msg or err)
        return events


@dataclass
class _Part:
    kind: str  # OpenCode's part type: text, reasoning, tool, step-finish, …
    shown: str = ""  # text or command output written so far
    started: bool = False  # a tool's prompt line / running event is out
    ended: bool = False
    folded: bool = False  # a compaction summary's text: collected, shown as one line when it ends


class ServeStreamTranslator(_Translator):
    """Server events relayed by ``serve_runner.py`` → OpenCodeEvent, ToolCall and live display text.

    Events are kept as :class:`OpenCodeEvent` except the high-rate ones (text deltas, repeated running
    updates of a tool), which only move the display; the raw lines stay in ``opencode/stdout.jsonl``. A
    tool call is reported once when it starts running and once when it ends.
    """

    def __init__(self, workdir: str, data_dir: str | None = None) -> None:
        super().__init__(workdir)
        self.data_dir = data_dir.rstrip("/") if data_dir else None  # OpenCode's data dir in the sandbox
        self.session_id: str | None = None
        self._parts: dict[str, _Part] = {}
        self._roles: dict[str, str] = {}  # message id -> role
        # Compaction: OpenCode adds a user message with a ``compaction`` part, then an assistant message
        # (agent/mode ``compaction``, ``summary: true``) whose text is the summary, then
        # ``session.compacted``. The summary is the conversation retold: shown as it streams it reads
        # like the output of the tool call before it, so it is folded to one line between two markers.
        self._summaries: set[str] = set()  # message ids of compaction summaries
        self._compacting = False  # a compaction part was seen; its summary message is next
        self._roles_seen_assistant: set[str] = set()
        self._context_tokens: int | None = None  # the context of the last agent step (OpenCode's count)
        self._before: int | None = None  # … when the compaction started
        # A compaction has ended and the next agent call has not reported its context yet: that call's
        # input is the context after the compaction (the summary's output tokens are not: the system
        # prompt, the tools and what followed the summary count too).
        self._measure_after = False
        self._subagent_sessions: set[Any] = set()  # subagent sessions whose marker is shown

    def _event(self, obj: dict[str, Any]) -> list[Event]:
        etype = str(obj.get("type", "unknown"))
        props = v if isinstance(v := obj.get("properties"), dict) else {}
        if etype == "message.part.delta":
            return self._delta(props)
        if etype == "message.part.updated" and isinstance(props.get("part"), dict):
            return self._part(obj, props["part"])
        events: list[Event] = [OpenCodeEvent(event_type=etype, payload=obj)]
        if etype == "runner.starting":
            events.append(display(f"{DIM}● starting opencode serve in the sandbox…{RESET}\n"))
        elif etype == "runner.listening":
            took = props.get("seconds")
            after = f" after {took:.1f}s" if isinstance(took, int | float) else ""
            events.append(
                display(f"{DIM}● opencode serve listening on port {props.get('port')}{after}{RESET}\n")
            )
        elif etype == "runner.ready":
            events.append(display(f"{DIM}● opencode serve ready ahead of the task{RESET}\n"))
        elif etype == "runner.task":
            waited = props.get("waited")
            ready = (
                f"; the server had been ready for {waited:.1f}s" if isinstance(waited, int | float) else ""
            )
            events.append(display(f"{DIM}● the task arrived{ready}{RESET}\n"))
        elif etype == "runner.session":
            self.session_id = props.get("sessionID")
            events.append(
                display(f"{DIM}● opencode session {self.session_id} (live from opencode serve){RESET}\n")
            )
        elif etype == "message.updated":
            info = props.get("info") or {}
            if info.get("id"):
                self._roles[str(info["id"])] = str(info.get("role"))
                if self._main(info.get("sessionID")) and info.get("role") == "assistant":
                    events += self._assistant(info)
        elif etype == "session.error" and self._main(props.get("sessionID")):
            err = props.get("error") or {}
            data = v if isinstance(err, dict) and isinstance(v := err.get("data"), dict) else {}
            events += self._error(data.get("message") or (err.get("name") if isinstance(err, dict) else err))
        elif etype == "session.compacted" and self._main(props.get("sessionID")):
            # what is left is said once the next call has measured it (see _assistant)
            before = f" (was {_tokens(self._before)} tokens)" if self._before is not None else ""
            events.append(display(f"{DIM}── context compacted{before} ──{RESET}\n"))
            self._compacting, self._before, self._measure_after = False, None, True
        elif etype == "runner.permission_rejected":
            patterns = props.get("patterns")
            metadata = props.get("metadata")
            rejected = RejectedPermission(
                permission=str(props.get("permission") or "?"),
                patterns=[str(p) for p in patterns] if isinstance(patterns, list) else [],
                metadata=metadata if isinstance(metadata, dict) else {},
                call_id=props.get("callID") if isinstance(props.get("callID"), str) else None,
                session_id=props.get("sessionID") if isinstance(props.get("sessionID"), str) else None,
            )
            self._rejected(rejected)
            shown = rejected.describe().replace("`", "")
            events.append(display(f"{YELLOW}! permission requested: {shown}; auto-rejected{RESET}\n"))
        elif etype == "runner.error":
            events += self._error(f"runner: {props.get('message')}")
        elif etype == "runner.stream_error":  # the runner reconnects; events in between are lost
            events.append(display(f"{YELLOW}! event stream interrupted: {props.get('error')}{RESET}\n"))
        elif etype == "runner.server_exited":
            code = props.get("returncode")
            events += self._error(
                f"{describe_exit(code if isinstance(code, int) else None, subject='opencode serve')} "
                "during the session"
            )
        return events

    def _assistant(self, info: dict[str, Any]) -> list[Event]:
        """Note an assistant message: a compaction summary, or an agent step's context; the first step
        after a compaction says the context it measured."""
        mid = str(info["id"])
        summary = info.get("summary") is True or "compaction" in (info.get("mode"), info.get("agent"))
        if summary or (self._compacting and mid not in self._roles_seen_assistant):
            self._summaries.add(mid)
        self._roles_seen_assistant.add(mid)
        tokens = info.get("tokens") if isinstance(info.get("tokens"), dict) else None
        if not tokens or mid in self._summaries:
            return []
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
        # OpenCode's own overflow count: input + cache read + output
        used = sum(
            v for v in (tokens.get("input"), cache.get("read"), tokens.get("output")) if isinstance(v, int)
        )
        if used <= 0:
            return []  # the message's first update: nothing measured yet
        self._context_tokens = used
        if not self._measure_after:
            return []
        self._measure_after = False
        # What the call was sent (the model's input, cached or not): the context it found.
        sent = sum(
            v for v in (tokens.get("input"), cache.get("read"), cache.get("write")) if isinstance(v, int)
        )
        return [
            display(
                f"{DIM}── context after the compaction: {_tokens(sent)} tokens (the next call's input) ──{RESET}\n"
            )
        ]

    def _compaction(self, raw: dict[str, Any]) -> list[Event]:
        self._compacting = True
        self._before = self._context_tokens
        tokens = f" · {_tokens(self._before)} tokens in context" if self._before is not None else ""
        return [display(f"{YELLOW}── compacting context ({compaction_trigger(raw)}){tokens} ──{RESET}\n")]

    def _folded(self, part: _Part) -> list[Event]:
        lines = part.shown.strip().splitlines()
        if not lines:
            return []
        first = fold_line(lines[0])
        more = f" … {len(lines)} lines, {len(part.shown):,} chars folded" if len(lines) > 1 else ""
        return [display(f"{DIM}▸ summary: {first}{more}{RESET}\n")]

    def _main(self, session_id: Any) -> bool:
        return self.session_id is None or session_id == self.session_id

    def _delta(self, props: dict[str, Any]) -> list[Event]:
        if props.get("field", "text") != "text" or not self._main(props.get("sessionID")):
            return []
        delta = props.get("delta")
        part = self._parts.get(str(props.get("partID")))
        if not isinstance(delta, str) or not delta or part is None or part.ended:
            return []
        if part.kind not in ("text", "reasoning"):
            return []
        part.shown += delta
        return [] if part.folded else [display(self._styled(part.kind, delta))]

    @staticmethod
    def _styled(kind: str, text: str) -> str:
        return styled_part(kind, text)

    def _part(self, obj: dict[str, Any], raw: dict[str, Any]) -> list[Event]:
        pid = str(raw.get("id") or "")
        kind = str(raw.get("type") or "")
        part = self._parts.setdefault(pid, _Part(kind=kind))
        main = self._main(raw.get("sessionID"))
        if kind == "tool":
            return self._tool(obj, raw, part) if main else self._subagent_tool(raw, part)
        if part.ended:
            return []
        events: list[Event] = [OpenCodeEvent(event_type="message.part.updated", payload=obj)]
        if not main:
            return events + self._subagent_text(raw, part)
        if kind == "step-finish":
            self.finished_cleanly = raw.get("reason") == "stop"
            part.ended = True
        elif kind == "compaction":
            part.ended = True
            events += self._compaction(raw)
        elif kind in ("text", "reasoning"):
            user = self._roles.get(str(raw.get("messageID"))) == "user"
            ended = bool((raw.get("time") or {}).get("end"))
            text = raw.get("text")
            if user or raw.get("synthetic") or not isinstance(text, str):
                part.ended = ended
                return events
            if str(raw.get("messageID")) in self._summaries:
                part.folded = True
                part.shown = text if len(text) >= len(part.shown) else part.shown
                if ended:
                    part.ended = True
                    events += self._folded(part)
                return events
            new = text[len(part.shown) :] if text.startswith(part.shown) else ""
            if new:
                events.append(display(self._styled(kind, new)))
                part.shown = text
            if ended:
                part.ended = True
                if part.shown and not part.shown.endswith("\n"):
                    events.append(display("\n"))
        return events

    # A subagent (the ``task`` tool) works in a session of its own: its finished tool calls and texts are
    # shown nested under a marker, so a delegation is not a silent gap; its events stay out of the
    # episode's tool-call and text accounting (they are in opencode/stdout.jsonl and the transcript).

    def _subagent_tool(self, raw: dict[str, Any], part: _Part) -> list[Event]:
        status = (raw.get("state") or {}).get("status")
        if part.ended or status not in ("completed", "error"):
            return []
        part.ended = True
        return [display(self._nested(raw.get("sessionID"), self.render_tool(self._tool_call(raw))))]

    def _subagent_text(self, raw: dict[str, Any], part: _Part) -> list[Event]:
        text = raw.get("text")
        ended = bool((raw.get("time") or {}).get("end"))
        user = self._roles.get(str(raw.get("messageID"))) == "user"
        if part.kind != "text" or not ended or user or raw.get("synthetic") or not isinstance(text, str):
            return []
        part.ended = True
        return (
            [display(self._nested(raw.get("sessionID"), styled(CYAN, text.strip())))] if text.strip() else []
        )

    def _nested(self, session_id: Any, text: str) -> str:
        head = ""
        if session_id not in self._subagent_sessions:
            self._subagent_sessions.add(session_id)
            head = f"{DIM}┌ subagent session {session_id}{RESET}\n"
        return head + "".join(f"{DIM}│{RESET} {line}\n" for line in text.rstrip("\n").split("\n"))

    def _tool(self, obj: dict[str, Any], raw: dict[str, Any], part: _Part) -> list[Event]:
        if part.ended:
            return []
        state = raw.get("state") or {}
        status = state.get("status")
        if status not in ("running", "completed", "error"):
            return []
        events: list[Event] = []
        call = self._tool_call(raw)
        if not part.started:
            part.started = True
            if status == "running":
                events.append(call.model_copy(update={"output": None}))
            if call.tool == "bash":
                events.append(display(bash_prompt(str(call.input.get("command", "")))))
            elif call.tool == "task" and status == "running":  # its subagent's work is shown nested
                what = call.input.get("description") or call.input.get("subagent_type") or "a task"
                events.append(display(f"{DIM}▸ delegating to a subagent: {what}{RESET}\n"))
        if call.tool == "bash":
            events += self._bash_state(part, status, state)
        if status == "running":
            return events
        part.ended = True
        events[:0] = [OpenCodeEvent(event_type="message.part.updated", payload=obj), call]
        if call.tool != "bash":
            events.append(display(self.render_tool(call)))
        elif call.status == "error":
            events.append(display(f"{RED}✖ {call.output or 'failed'}{RESET}\n"))
        return events + self._fault_note(call)

    def _bash_state(self, part: _Part, status: str, state: dict[str, Any]) -> list[Event]:
        """A bash part's output as it grows. Live, OpenCode sends ``metadata.output``: the whole output
        while it is short, then ``...`` and its last 30,000 characters (a sliding window). The final
        ``state.output`` is formatted for the model (truncation notice, ``<shell_metadata>`` notes), so
        the display keeps following the live copy and only adds such notes at the end."""
        metadata = v if isinstance(v := state.get("metadata"), dict) else {}
        live = v if isinstance(v := metadata.get("output"), str) else ""
        final = v if isinstance(v := state.get("output"), str) else ""
        if status == "running":
            return self._bash_output(part, live)
        # Nothing came live (e.g. a silent command that timed out): the final text is all there is.
        events = self._bash_output(part, live if live.strip() else final)
        if part.shown and not part.shown.endswith("\n"):
            events.append(display("\n"))
        note = final.find("<shell_metadata>")
        # The notes go after the live copy, unless OpenCode already put them there (a silent command cut
        # at its timeout ends with a live copy equal to the final text).
        if live.strip() and note >= 0 and "<shell_metadata>" not in live:
            events.append(display(styled(DIM, _ended(final[note:]))))
        saved = metadata.get("outputPath")
        if metadata.get("truncated") and isinstance(saved, str):
            where = self._saved_output(saved)
            events.append(display(f"{DIM}… full output saved by OpenCode: {where}{RESET}\n"))
        return events

    def _saved_output(self, path: str) -> str:
        if self.data_dir and path.startswith(self.data_dir + "/"):
            return "opencode/data/opencode/" + path[len(self.data_dir) + 1 :] + " in the run directory"
        return path + " in the sandbox"

    @staticmethod
    def _bash_output(part: _Part, so_far: str) -> list[Event]:
        """What of ``so_far`` (the output so far, or OpenCode's window on its tail) is not written yet."""
        windowed = so_far.startswith(LIVE_WINDOW_MARK) and len(so_far) > LIVE_WINDOW
        body = so_far[len(LIVE_WINDOW_MARK) :] if windowed else so_far
        overlap = len(part.shown) if body.startswith(part.shown) else _overlap(part.shown, body)
        new = body[overlap:]
        # A window that continues nothing shown (the first update already came windowed, or more than a
        # window's worth arrived between two updates): the output before it was never streamed.
        if not overlap and (windowed or part.shown):
            gap = "output skipped: OpenCode streams only the last 30,000 characters"
            marker = ("" if not part.shown or part.shown.endswith("\n") else "\n") + f"{DIM}⋯ {gap}{RESET}\n"
            # The window starts wherever 30,000 characters back falls, usually inside a line: its first
            # line is marked as possibly cut rather than passed off as a whole line.
            new = marker + (f"{DIM}…{RESET}" if windowed and new else "") + new
        part.shown = body
        return [display(new)] if new else []


def _tokens(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def fold_line(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _overlap(shown: str, window: str) -> int:
    """The longest end of ``shown`` that ``window`` starts with (0 if under an anchor's length)."""
    anchor = window[:OVERLAP_ANCHOR]
    if not shown or len(anchor) < OVERLAP_ANCHOR:
        return 0
    at = shown.find(anchor, max(0, len(shown) - len(window)))
    while at != -1:
        if window.startswith(shown[at:]):
            return len(shown) - at
        at = shown.find(anchor, at + 1)
    return 0


class EventRenderer:
    """The engine's rendering of recorded events that came without one on the ``display`` stream (an
    older engine, or a scripted event stream): tool calls and OpenCode's text and error events, rendered
    with the same functions the translators use. ``render(event)`` returns what to append ("" if
    nothing); it keeps per-call and per-part progress, so repeated updates only add what is new."""

    def __init__(self, workdir: str = "") -> None:
        self.workdir = workdir
        self._output: dict[str, str] = {}  # bash call id -> output written so far
        self._headed: set[str] = set()  # bash call ids whose prompt line is written
        self._done: set[str] = set()  # finished calls and parts
        self._parts: dict[str, str] = {}  # text part id -> text written so far

    @staticmethod
    def renders(event: Event) -> bool:
        """Would ``render`` write something for this event (so a display rendering of it may follow)?"""
        if isinstance(event, ToolCall):
            return event.tool == "bash" or event.status != "running"
        if isinstance(event, OpenCodeEvent):
            return event.event_type in _TEXT_EVENTS
        return False

    def render(self, event: Event) -> str:
        try:
            if isinstance(event, ToolCall):
                return self._tool(event)
            if isinstance(event, OpenCodeEvent):
                return self._opencode(event)
        except Exception as exc:  # a malformed payload must not stop the stream
            what = event.tool if isinstance(event, ToolCall) else getattr(event, "event_type", event.type)
            return render_error(f"{event.type} {what} could not be shown: {exc!r}")
        return ""

    def _tool(self, call: ToolCall) -> str:
        cid = call.call_id
        if cid in self._done:
            return ""
        if call.tool != "bash":
            if call.status == "running":
                return ""
            self._done.add(cid)
            return render_tool(call, self.workdir)
        out = ""
        if cid not in self._headed:
            self._headed.add(cid)
            out = bash_prompt(str(call.input.get("command") or call.title or ""))
        so_far = call.output or ""
        printed = self._output.get(cid, "")
        if so_far.startswith(printed):
            out += so_far[len(printed) :]
        else:  # rewritten, not continued: show it again in full
            out += ("" if not printed or printed.endswith("\n") else "\n") + so_far
        self._output[cid] = so_far
        if call.status != "running":
            self._done.add(cid)
            self._output.pop(cid, None)
            out = _ended(out) if so_far or out else out
            if call.status == "error":
                out += render_error(f"{call.title or 'command'} failed")
        return out

    def _opencode(self, ev: OpenCodeEvent) -> str:
        payload, kind = ev.payload, ev.event_type
        if kind in ("text", "reasoning"):  # opencode run: a finished part
            finished = v if isinstance(v := payload.get("part"), dict) else payload
            text = finished.get("text")
            if finished.get("synthetic") or not isinstance(text, str) or not text.strip():
                return ""
            return render_text(text.rstrip()) if kind == "text" else _ended(styled_part(kind, text.rstrip()))
        if kind == "message.part.updated":
            props = payload.get("properties", payload)
            part = props.get("part") if isinstance(props, dict) else None
            if (
                isinstance(part, dict)
                and part.get("type") in ("text", "reasoning")
                and not part.get("synthetic")
            ):
                return self._part(part, str(part["type"]), complete=bool((part.get("time") or {}).get("end")))
            return ""
        if kind == "message.part.delta":
            props = payload.get("properties", payload)
            delta = props.get("delta")
            if props.get("field", "text") != "text" or not isinstance(delta, str):
                return ""
            pid = str(props.get("partID") or props.get("id") or "delta")
            if pid in self._done:
                return ""
            self._parts[pid] = self._parts.get(pid, "") + delta
            return styled_part("text", delta)
        if kind in ("error", "session.error"):
            err = payload.get("error") or (payload.get("properties") or {}).get("error") or payload
            if isinstance(err, dict):
                data = v if isinstance(v := err.get("data"), dict) else {}
                err = data.get("message") or err.get("message") or err.get("name") or err
            return render_error(str(err)[:2000])
        return ""

    def _part(self, part: dict[str, Any], kind: str, complete: bool) -> str:
        text = part.get("text")
        pid = str(part.get("id") or f"{kind}-{len(self._parts)}")
        if not isinstance(text, str) or pid in self._done:
            return ""
        printed = self._parts.get(pid, "")
        new = text[len(printed) :] if text.startswith(printed) else "\n" + text
        self._parts[pid] = text
        out = styled_part(kind, new) if new else ""
        if complete:
            self._done.add(pid)
            self._parts.pop(pid, None)
            if text and not text.endswith("\n"):
                out += "\n"
        return out


_TEXT_EVENTS = frozenset(
    {"text", "reasoning", "message.part.updated", "message.part.delta", "error", "session.error"}
)
