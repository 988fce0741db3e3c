"""The model side of one episode: the embedded scripted model (or a real upstream) behind the
recording proxy, reachable from sandboxes over TCP on loopback and over a Unix socket.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opencode_tui_core.calls.progress import EMPTY_RESPONSE_KIND
from opencode_tui_core.calls.records import AnswerFault, ModelCallRecord, body_excerpt
from opencode_tui_core.config import ModelSettings
from opencode_tui_core.events import Compaction, Event, ModelCall
from opencode_tui_core.failures import Evidence, FailureEvent, FailureStage, ModelCallDetails
from opencode_tui_core.model._http import Handler
from opencode_tui_core.model.hold import CallGate
from opencode_tui_core.model.proxy import ModelProxy
from opencode_tui_core.model.replay import Replayer
from opencode_tui_core.model.scripted import ScriptedModel
from opencode_tui_core.tasks import Task

# At most this many of the failed calls behind a failure are cited as its evidence (the last ones).
EVIDENCE_CALLS = 10


def call_evidence(rec: ModelCallRecord) -> Evidence:
    """One failed call as the proxy recorded it: the evidence a model failure rests on."""
    return Evidence(
        source="model.proxy",
        observed_at=rec.started_at,
        scope=rec.call_id,
        data={
            "call_id": rec.call_id,
            "status": rec.status,
            "proxy_status": rec.proxy_status,
            "error": rec.error,
            "stream_errors": rec.stream_errors[:3],
            "body_excerpt": body_excerpt(rec.response_body),
            "latency_s": rec.latency_s,
        },
    )


def failure_from_record(
    rec: ModelCallRecord, stage: FailureStage, attempts: int = 1, failed: list[ModelCallRecord] | None = None
) -> FailureEvent:
    """The FailureEvent a failed model call stands for (its status decides the kind); ``failed``: the
    failed calls behind it, in order (the last one included), cited as its evidence."""
    status = rec.status
    if status == 429:
        kind, what = "model_rate_limited", "rate limited (429)"
    elif status is not None and status >= 500:
        kind, what = "model_server_error", f"answered {status}"
    elif status is not None and status >= 400:
        kind, what = "model_api_error", f"rejected the request ({status})"
    elif status is None:
        kind, what = "model_unreachable", f"could not be reached ({rec.error or 'no response'})"
    elif rec.answer_fault is AnswerFault.ERROR_OBJECT:
        kind, what = "model_server_error", f"answered {status} with an error ({rec.error})"
    elif rec.answer_fault is not None:
        kind, what = EMPTY_RESPONSE_KIND, f"gave no answer ({rec.error})"
    elif rec.stream_errors:
        kind, what = "model_malformed_response", f"sent a malformed stream ({rec.stream_errors[0]})"
    else:
        kind, what = "model_stalled", f"stopped producing data ({rec.error or 'stream ended early'})"
    return FailureEvent(
        kind=kind,
        stage=stage,
        operation=f"model call {rec.method} {rec.path}",
        message=f"the model endpoint {what}; OpenCode gave up after {attempts} call(s) for this turn",
        http_status=status if status is not None and status >= 400 else None,
        details=ModelCallDetails(call_id=rec.call_id, status=status, attempts=attempts),
        evidence=[call_evidence(r) for r in (failed or [rec])[-EVIDENCE_CALLS:]],
    )


def _failed(rec: ModelCallRecord) -> bool:
    return rec.failed or bool(rec.stream_errors)


class ModelEndpoint:
    """``async with ModelEndpoint(task, settings, run_dir, on_call=emit) as ep:`` → ``ep.tcp_url``,
    ``ep.unix_path``; every call is recorded in ``run_dir/model_calls.jsonl`` and emitted live."""

    def __init__(
        self,
        task: Task,
        settings: ModelSettings,
        run_dir: Path,
        on_call: Callable[[Event], Any],
        gate: CallGate | None = None,
        replay: Replayer | None = None,
        listen: tuple[socket.socket, str] | None = None,
        access_token: str | None = None,
        side: tuple[str, Handler] | None = None,
    ) -> None:
        self.task = task
        self.settings = settings
        self.run_dir = Path(run_dir)
        self._emit = on_call
        self.scripted: ScriptedModel | None = None
        self.proxy: ModelProxy | None = None
        self._tmp: str | None = None
        self.compactions = 0
        self.gate = gate  # the debugger's breakpoints (opencode_tui_core.model.hold)
        self.replay = replay  # rerun/fork: the parent's recorded answers (opencode_tui_core.model.replay)
        # OpenCode's API key for the proxy: only this episode's OpenCode can spend the upstream key.
        # A server started ahead (core/episode/ahead.py) was configured with its token before the
        # episode existed: the episode's proxy accepts that one.
        self.access_token = access_token or secrets.token_urlsafe(24)
        # A warm sandbox's socket (bound and listening, its file bind-mounted into the sandbox) and its
        # private directory: served here, and removed with the endpoint (core/episode/pool.py).
        self._listen = listen
        self._side = side  # requests that are not the model's (ModelProxy ``side``)

    async def __aenter__(self) -> ModelEndpoint:
        # Unix socket paths are limited to ~108 bytes: keep it short, private, and outside the run dir.
        self._tmp = self._listen[1] if self._listen else tempfile.mkdtemp(prefix="octui-")
        try:
            upstream = self.settings.url
            if upstream is None:
                if self.task.trajectory_path is None:
                    raise ValueError(f"task {self.task.id} has no model.trajectory for the scripted model")
                self.scripted = await ScriptedModel(
                    self.task.trajectory_path,
                    placeholders={"workdir": self.task.workdir},
                    model_id=self.settings.name,
                ).start()
                upstream = self.scripted.url
            self.proxy = await ModelProxy(
                upstream,
                record_dir=self.run_dir,
                on_call=self._on_call,
                api_key_env=self.settings.api_key_env,
                unix_path=self._listen[0] if self._listen else f"{self._tmp}/model.sock",
                host=self.settings.proxy_host,
                access_token=self.access_token,
                gate=self.gate,
                replay=self.replay,
                side=self._side,
                capture_tokens=self.settings.capture_tokens,
            ).start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proxy is not None:
            await self.proxy.close()
        if self.scripted is not None:
            await self.scripted.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def tcp_url(self) -> str:
        """The proxy's base URL as sandboxes reach it (``model.proxy_advertise``), without ``/v1``
        (the harness appends it)."""
        assert self.proxy is not None and self.proxy.port is not None
        return f"http://{self.settings.proxy_address}:{self.proxy.port}"

    @property
    def unix_path(self) -> str | None:
        return None if self.proxy is None else self.proxy.unix_path

    @property
    def records(self) -> list[ModelCallRecord]:
        return [] if self.proxy is None else list(self.proxy.records)

    def _on_call(self, event: ModelCall) -> None:
        self._emit(event)
        if event.kind == "compaction" and event.status == 200 and event.error is None:
            self.compactions += 1
            self._emit(Compaction(count=self.compactions, trigger="auto"))

    def last_failed_call(self) -> _FailedCall | None:
        """The last call, if it failed: the call OpenCode gave up on (earlier failures were retried)."""
        records = [r for r in self.records if r.kind != "title"]
        if not records or not _failed(records[-1]):
            return None
        tail: list[ModelCallRecord] = []
        for rec in reversed(records):
            if not _failed(rec):
                break
            tail.insert(0, rec)
        return _FailedCall(tail)


class _FailedCall:
    """The failed calls at the end of the run (OpenCode retried, then gave up on the last one)."""

    def __init__(self, failed: list[ModelCallRecord]) -> None:
        self.failed = failed
        self.record = failed[-1]
        self.attempts = len(failed)

    def to_failure(self, stage: FailureStage) -> FailureEvent:
        return failure_from_record(self.record, stage, self.attempts, self.failed)
