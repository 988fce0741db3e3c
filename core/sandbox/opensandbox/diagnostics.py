"""Evidence from the OpenSandbox server about one sandbox, and the shared diagnosis entry point.

Sources (all scoped to the sandbox id; see ``oom_rules`` for what confirms an OOM kill):

* ``opensandbox.lifecycle`` – ``GET /sandboxes/{id}``: ``status.state/reason/message``. Only the
  structured fields count: a terminal ``state`` (Failed, Terminated) whose ``reason`` *code* is one
  of the recognised OOM codes (``settings.oom_reason_codes``, matched exactly) confirms an OOM kill.
  The ``message`` is free text and never evidence (``npm ERR! JavaScript heap out of memory`` in a
  message is a program's output, not a kernel report). Server 1.1.x (Docker runtime) reports an
  OOM-killed main process as ``Failed / CONTAINER_EXITED_ERROR / "…exited with code 137."``: no
  OOM code, so it confirms nothing.
* ``opensandbox.diagnostics`` – ``GET /sandboxes/{id}/diagnostics/events?scope=runtime`` (a JSON
  descriptor with display text; the supported endpoint) and, as a fallback when that yields no
  verdict, the deprecated plain-text ``GET /sandboxes/{id}/diagnostics/inspect``. The diagnostics
  API says its text is for humans and has no stable line schema, so reading an OOM from it is
  **opt-in** (``settings.oom_from_diagnostics``, default off): its evidence carries ``admitted``
  and only admitted reports can confirm. The parsers accept the formats of server 1.1.x's Docker
  runtime and treat anything they do not recognise as "no verdict" (``OOMKilled: None``).

``Diagnoser.diagnose`` is the one entry point for exec and PTY failures. It runs inside the caller's
deadline (starting no request after it) and reads the lifecycle; when the lifecycle is not yet
terminal it watches it until it is (or the budget ends). With diagnostics confirmation on, it also
makes an initial report round and **one** final report round once the lifecycle turns terminal: at
most two report rounds per call.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import httpx

from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox.oom import oom_confirmed
from opencode_tui_core.sandbox.opensandbox.http import Http, RequestFailed
from opencode_tui_core.sandbox.opensandbox.oom_rules import SOURCE_OS_DIAGNOSTICS, SOURCE_OS_LIFECYCLE
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxPolicyConfig

LIFECYCLE_FORMAT = "opensandbox-lifecycle/v1"
EVENTS_FORMAT = "opensandbox-1.1-docker-events-text"
INSPECT_FORMAT = "opensandbox-1.1-docker-inspect-text"
SUPPORTED_SERVER_VERSIONS = ("1.1",)  # major.minor prefixes whose diagnostics text was checked

TERMINAL_STATES = frozenset({"Failed", "Terminated"})
_CONTAINER_NAME = re.compile(r"^sandbox-([0-9A-Za-z][0-9A-Za-z._-]*)$")
_KV = re.compile(r"^([A-Za-z][A-Za-z ]*?):\s*(.*)$")
_MEMORY = re.compile(r"^(\d+)\s*MiB$")
CONTENT_EXCERPT = 2000


def lifecycle_oom_code(status: dict[str, Any], oom_reason_codes: Collection[str]) -> str | None:
    """The recognised OOM reason code of a terminal lifecycle status, else ``None``.

    Structured fields only: the ``state`` must be terminal and the ``reason`` code one of
    ``oom_reason_codes`` exactly (no case folding, no substrings). The ``message`` is never read.
    """
    reason = status.get("reason")
    if status.get("state") in TERMINAL_STATES and isinstance(reason, str) and reason in oom_reason_codes:
        return reason
    return None


def lifecycle_evidence(
    sandbox_id: str,
    body: dict[str, Any] | None,
    *,
    exists: bool = True,
    error: str | None = None,
    server_version: str | None = None,
    oom_reason_codes: Collection[str] = (),
) -> Evidence:
    data: dict[str, Any] = {"format": LIFECYCLE_FORMAT, "exists": exists, "server_version": server_version}
    if error is not None:
        data["error"] = error
    if body is not None:
        status = v if isinstance(v := body.get("status"), dict) else {}
        data.update(
            {
                "sandbox_id": body.get("id"),
                "state": status.get("state"),
                "reason": status.get("reason"),
                "message": (status.get("message") or "")[:500] or None,
                "last_transition_at": status.get("lastTransitionAt"),
                "expires_at": body.get("expiresAt"),
                "oom_reason_code": (code := lifecycle_oom_code(status, oom_reason_codes)),
                "oom_reported": code is not None and body.get("id") == sandbox_id,
            }
        )
    elif not exists:
        data["sandbox_id"] = sandbox_id
    return Evidence(source=SOURCE_OS_LIFECYCLE, scope=sandbox_id, data=data)


def _subject_from_name(name: str | None) -> str | None:
    m = _CONTAINER_NAME.match((name or "").strip().lstrip("/"))
    return m.group(1) if m else None


def parse_events_text(content: str) -> dict[str, Any]:
    """Server 1.1.x Docker ``diagnostics/events`` text: ``Container: <short id> (<name>)``,
    ``Status:``, ``Created:``/``Started:``/``Finished:``, and ``Event:`` lines such as
    ``Event: OOMKilled - container was killed due to out-of-memory`` or ``Event: Exited with code N``.
    """
    out: dict[str, Any] = {"OOMKilled": None, "recognised": False, "events": []}
    for raw in content.splitlines():
        m = _KV.match(raw.strip())
        if not m:
            continue
        key, value = m.group(1).strip(), m.group(2).strip()
        if key == "Container":
            out["recognised"] = True
            cm = re.match(r"^(\S+)\s*\(([^)]*)\)$", value)
            if cm:
                out["container_short_id"], out["container_name"] = cm.group(1), cm.group(2)
                out["subject"] = _subject_from_name(cm.group(2))
        elif key == "Status":
            out["status"] = value
        elif key in ("Created", "Started", "Finished"):
            out[key.lower() + "_at"] = value
        elif key == "Event":
            out["events"].append(value[:200])
            if value.startswith("OOMKilled"):
                out["OOMKilled"] = True
            em = re.match(r"^Exited with code (-?\d+)", value)
            if em:
                out["exit_code"] = int(em.group(1))
    if out["recognised"] and "status" in out and out["OOMKilled"] is None:
        out["OOMKilled"] = False  # this format prints the OOMKilled event whenever Docker's flag is set
    return out


def parse_inspect_text(content: str) -> dict[str, Any]:
    """Server 1.1.x Docker ``diagnostics/inspect`` text (deprecated endpoint): ``Key: value`` lines
    (``Name``, ``Status``, ``Running``, ``OOMKilled``, ``Exit Code``...), then indented sections
    (``Resources:``, ``Labels:`` with ``k=v`` lines...)."""
    out: dict[str, Any] = {"OOMKilled": None, "recognised": False}
    section = None
    labels: dict[str, str] = {}
    for raw in content.splitlines():
        if not raw.strip():
            continue
        if raw.startswith((" ", "\t")):
            line = raw.strip()
            if section == "Labels" and "=" in line:
                k, _, v = line.partition("=")
                labels[k] = v
            elif section == "Resources":
                m = _KV.match(line)
                if m and m.group(1) == "Memory":
                    mm = _MEMORY.match(m.group(2).strip())
                    if mm:
                        out["memory_limit_bytes"] = int(mm.group(1)) << 20
            continue
        m = _KV.match(raw.strip())
        if not m:
            continue
        key, value = m.group(1).strip(), m.group(2).strip()
        if not value:
            section = key
            continue
        section = None
        if key == "Container ID":
            out["recognised"] = True
            out["container_short_id"] = value
        elif key == "Name":
            out["container_name"] = value
        elif key == "Status":
            out["status"] = value
        elif key in ("Running", "OOMKilled"):
            out[key] = {"true": True, "false": False}.get(value.lower())
        elif key == "Exit Code":
            out["exit_code"] = int(value) if re.fullmatch(r"-?\d+", value) else None
        elif key == "Finished At":
            out["finished_at"] = value
    label_id = labels.get("opensandbox.io/id")
    name_id = _subject_from_name(out.get("container_name"))
    if label_id and name_id and label_id != name_id:
        out["subject"] = None  # contradictory report: about nothing we can name
    else:
        out["subject"] = label_id or name_id
    if not out["recognised"]:
        out["OOMKilled"] = None
    return out


def diagnostics_evidence(
    sandbox_id: str,
    endpoint: str,
    parsed: dict[str, Any] | None,
    *,
    content: str | None = None,
    oom_at_connect: bool | None = None,
    error: str | None = None,
    server_version: str | None = None,
    extra: dict[str, Any] | None = None,
    admitted: bool = False,
) -> Evidence:
    """``admitted``: whether this report may confirm an OOM (``settings.oom_from_diagnostics``)."""
    data: dict[str, Any] = {
        "endpoint": endpoint,
        "format": EVENTS_FORMAT if endpoint.endswith("events") else INSPECT_FORMAT,
        "server_version": server_version,
        "admitted": admitted,
        **(extra or {}),
    }
    if error is not None:
        data["error"] = error
    if parsed is not None:
        data.update(parsed)
    if oom_at_connect is not None:
        data["OOMKilledAtConnect"] = oom_at_connect
    if content is not None:
        data["content_excerpt"] = content[:CONTENT_EXCERPT]
    return Evidence(source=SOURCE_OS_DIAGNOSTICS, scope=sandbox_id, data=data)


@dataclass
class Diagnosis:
    """What a diagnosis saw, in order; ``oom`` is the confirming piece, if any."""

    evidence: list[Evidence] = field(default_factory=list)
    oom: Evidence | None = None
    state: str | None = None
    gone: bool = False
    rounds: int = 0  # report rounds (events, with the deprecated inspect as fallback): at most two,
    # and none unless diagnostics confirmation is on
    deadline_reached: bool = False

    @property
    def terminal(self) -> bool:
        return self.gone or self.state in TERMINAL_STATES


class Diagnoser:
    """Reads lifecycle and diagnostic reports of one sandbox, always inside a given deadline."""

    def __init__(
        self,
        http: Http,
        policy: OpenSandboxPolicyConfig,
        sandbox_id: str,
        api_url: Callable[[str], str],
        *,
        oom_at_connect: bool | None = None,
        server_version: Callable[[], str | None] = lambda: None,
        oom_reason_codes: Collection[str] = (),
        oom_from_diagnostics: bool = False,
    ):
        self.http = http
        self.policy = policy
        self.sandbox_id = sandbox_id
        self.api_url = api_url
        self.oom_at_connect = oom_at_connect
        self.server_version = server_version
        self.oom_reason_codes = frozenset(oom_reason_codes)
        self.oom_from_diagnostics = oom_from_diagnostics

    def _remaining(self, deadline: float) -> float:
        return deadline - asyncio.get_running_loop().time()

    async def lifecycle(
        self, deadline: float, *, operation: str = "diagnostics"
    ) -> tuple[Evidence, str | None, bool]:
        """(evidence, state, gone) from one lifecycle read, bounded by the deadline."""
        sid = self.sandbox_id
        timeout = min(self.policy.diagnostic_timeouts.lifecycle_s, self._remaining(deadline))
        if timeout <= 0:
            raise TimeoutError("no time left for a lifecycle read")
        try:
            response = await self.http.request(
                operation,
                "GET",
                self.api_url(f"/sandboxes/{sid}"),
                timeout=timeout,
                deadline=deadline,
                not_found_kind="sandbox_lost",
            )
        except RequestFailed as exc:
            if exc.http_status == 404:
                return (
                    lifecycle_evidence(sid, None, exists=False, server_version=self.server_version()),
                    None,
                    True,
                )
            return (
                lifecycle_evidence(sid, None, error=str(exc), server_version=self.server_version()),
                None,
                False,
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            ev = lifecycle_evidence(
                sid, None, error="unparseable lifecycle answer", server_version=self.server_version()
            )
            return ev, None, False
        ev = lifecycle_evidence(
            sid, body, server_version=self.server_version(), oom_reason_codes=self.oom_reason_codes
        )
        return ev, ev.data.get("state"), False

    async def events(self, deadline: float) -> Evidence:
        sid = self.sandbox_id
        endpoint = "diagnostics/events"
        timeout = min(self.policy.diagnostic_timeouts.events_s, self._remaining(deadline))
        if timeout <= 0:
            raise TimeoutError("no time left for a diagnostics read")
        try:
            response = await self.http.request(
                "diagnostics",
                "GET",
                self.api_url(f"/sandboxes/{sid}/diagnostics/events"),
                params={"scope": "runtime"},
                timeout=timeout,
                deadline=deadline,
            )
            descriptor = response.json()
        except (RequestFailed, ValueError) as exc:
            return diagnostics_evidence(
                sid, endpoint, None, error=str(exc)[:500], server_version=self.server_version()
            )
        if not isinstance(descriptor, dict):
            return diagnostics_evidence(
                sid, endpoint, None, error="descriptor is not an object", server_version=self.server_version()
            )
        extra = {
            "descriptor_sandbox_id": descriptor.get("sandboxId"),
            "delivery": descriptor.get("delivery"),
            "truncated": descriptor.get("truncated"),
        }
        content = descriptor.get("content")
        if descriptor.get("delivery") not in (None, "inline") or not isinstance(content, str):
            return diagnostics_evidence(
                sid,
                endpoint,
                None,
                error="no inline content (a content URL is not followed)",
                server_version=self.server_version(),
                extra=extra,
            )
        return diagnostics_evidence(
            sid,
            endpoint,
            parse_events_text(content),
            content=content,
            oom_at_connect=self.oom_at_connect,
            server_version=self.server_version(),
            extra=extra,
            admitted=self.oom_from_diagnostics,
        )

    async def inspect_text(self, deadline: float) -> Evidence:
        sid = self.sandbox_id
        endpoint = "diagnostics/inspect"
        timeout = min(self.policy.diagnostic_timeouts.inspect_s, self._remaining(deadline))
        if timeout <= 0:
            raise TimeoutError("no time left for a diagnostics read")
        try:
            response = await self.http.request(
                "diagnostics",
                "GET",
                self.api_url(f"/sandboxes/{sid}/diagnostics/inspect"),
                timeout=timeout,
                deadline=deadline,
            )
            content = response.text
        except (RequestFailed, httpx.HTTPError) as exc:
            return diagnostics_evidence(
                sid, endpoint, None, error=str(exc)[:500], server_version=self.server_version()
            )
        return diagnostics_evidence(
            sid,
            endpoint,
            parse_inspect_text(content),
            content=content,
            oom_at_connect=self.oom_at_connect,
            server_version=self.server_version(),
            admitted=self.oom_from_diagnostics,
        )

    async def report_round(self, deadline: float) -> list[Evidence]:
        """One report round: the events descriptor, and the deprecated inspect only if events gave
        no verdict (unrecognised text, no inline content, or an error)."""
        first = await self.events(deadline)
        if first.data.get("OOMKilled") is not None and first.data.get("subject") == self.sandbox_id:
            return [first]
        if self._remaining(deadline) <= 0:
            return [first]
        return [first, await self.inspect_text(deadline)]

    async def diagnose(self, deadline: float, into: Diagnosis | None = None) -> Diagnosis:
        """Lifecycle (watched until terminal); with diagnostics confirmation on, an initial report
        round and one final round when the lifecycle turns terminal.

        Nothing is started after ``deadline``; if it passes, what was seen so far is returned with
        ``deadline_reached`` set. ``into`` is filled as the diagnosis goes (a caller whose own cap
        cancels it keeps what was seen).
        """
        diagnosis = into if into is not None else Diagnosis()
        loop = asyncio.get_running_loop()
        polling = self.policy.evidence_polling
        try:
            async with asyncio.timeout_at(deadline):
                await self._diagnose(diagnosis, deadline, loop.time() + polling.budget_s)
        except TimeoutError:
            diagnosis.deadline_reached = True
        return self.conclude(diagnosis)

    def conclude(self, diagnosis: Diagnosis, *, cut: bool = False) -> Diagnosis:
        """Settle what ``diagnosis`` saw (``cut``: a caller's own cap stopped it part way)."""
        diagnosis.deadline_reached = diagnosis.deadline_reached or cut
        diagnosis.oom = oom_confirmed(diagnosis.evidence, scope=self.sandbox_id)
        return diagnosis

    async def _diagnose(self, d: Diagnosis, deadline: float, watch_until: float) -> None:
        loop = asyncio.get_running_loop()
        polling = self.policy.evidence_polling

        def confirmed() -> bool:
            return oom_confirmed(d.evidence, scope=self.sandbox_id) is not None

        ev, d.state, d.gone = await self.lifecycle(deadline)
        d.evidence.append(ev)
        if confirmed() or d.gone:
            return  # a recognised OOM code; or the container is removed: nothing to inspect
        if self.oom_from_diagnostics:
            d.evidence.extend(await self.report_round(deadline))
            d.rounds += 1
        if confirmed() or d.terminal or not polling.enabled:
            return
        # Not terminal yet: watch the lifecycle (a terminal status may carry an OOM code); once it
        # turns terminal, one final report round when diagnostics confirmation is on.
        while True:
            wait = polling.interval_s
            if loop.time() + wait >= min(deadline, watch_until):
                return
            await asyncio.sleep(wait)
            ev, d.state, d.gone = await self.lifecycle(deadline)
            d.evidence.append(ev)
            if confirmed() or d.gone:
                return
            if d.terminal:
                if self.oom_from_diagnostics:
                    d.evidence.extend(await self.report_round(deadline))
                    d.rounds += 1
                return
