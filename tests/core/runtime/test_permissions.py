"""``runtime.permissions`` both ways, against the real OpenCode binary in real sandboxes (bubblewrap and
Docker): an agent that reads a file outside its workdir (/etc/passwd).

With ``default``, OpenCode asks for ``external_directory`` (pattern ``/etc/*``); nobody can answer, the ask
is rejected, OpenCode ends the turn and the episode records ``agent_permission_rejected`` naming the
permission and the pattern. With ``allow-all`` nothing is asked: the read succeeds and the task scores 1.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.config import AgentConfig, ModelSettings, PermissionProfile
from opencode_tui_core.events import Event, FailureRecorded, TerminalOutput, ToolCall
from opencode_tui_core.failures import (
    DEFAULT_CLASSIFICATION,
    FailureClass,
    PermissionDetails,
    classify,
    is_registered,
)
from opencode_tui_core.runtime.opencode import PERMISSION_PROFILES, build_config
from opencode_tui_core.runtime.stream import RunStreamTranslator

DOCKER_IMAGE = "opencode-tui/base:bookworm"
# /etc/passwd: a regular file in every sandbox (bubblewrap's rootfs has no /etc/hostname).
READ_OUTSIDE = {"name": "read", "arguments": {"filePath": "/etc/passwd"}}
WRITE_HELLO = {
    "name": "write",
    "arguments": {"filePath": "{workdir}/hello.txt", "content": "Hello from OpenCode\n"},
}
# Read outside the workdir first, then do the task: the write happens only if the read was allowed.
STEPS = [{"tool_calls": [READ_OUTSIDE]}, {"tool_calls": [WRITE_HELLO]}, {"text": "Done."}]
# What ``opencode run`` 1.18.32 wrote to its stderr (output.log) for that read, colours included.
RUN_STDERR_LINE = (
    "\x1b[93m\x1b[1m! \x1b[0mpermission requested: external_directory (/etc/*); auto-rejecting\n"
)


def test_profiles_are_validated_and_become_opencode_permission_config():
    assert AgentConfig().runtime.permissions == "default"
    assert set(PERMISSION_PROFILES) == set(get_args(PermissionProfile))
    with pytest.raises(ValidationError, match="allow-all"):
        AgentConfig.model_validate({"runtime": {"permissions": "yes"}})
    default = build_config(ModelSettings(), "http://x/v1", None, None)["permission"]
    allow_all = build_config(ModelSettings(), "http://x/v1", None, None, "allow-all")["permission"]
    assert default == {"edit": "allow", "bash": "allow", "webfetch": "deny"}
    # Order matters to OpenCode (the last matching rule wins): everything, then no web fetches.
    assert list(allow_all.items()) == [("*", "allow"), ("webfetch", "deny")]


def test_kind_is_registered_and_the_agents_doing():
    assert is_registered("agent_permission_rejected")
    from opencode_tui_core.failures import FailureEvent, FailureStage

    failure = FailureEvent(
        kind="agent_permission_rejected", stage=FailureStage.AGENT, operation="run opencode", message="m"
    )
    assert classify(failure, DEFAULT_CLASSIFICATION) is FailureClass.MODEL


def test_run_harness_rejection_line_is_parsed_from_its_stderr_log():
    stream = RunStreamTranslator("/app")
    stream.feed_log("opencode-tui: something else\n" + RUN_STDERR_LINE)
    (rejected,) = stream.rejected_permissions
    assert (rejected.permission, rejected.patterns) == ("external_directory", ["/etc/*"])
    assert stream.last_error and "`external_directory` for /etc/*" in stream.last_error


def _record(ep) -> list[Event]:
    seen: list[Event] = []
    ep.bus.subscribe(seen.append)
    return seen


def _docker_ready() -> None:
    if subprocess.run(["docker", "image", "inspect", DOCKER_IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"docker or {DOCKER_IMAGE} unavailable (scripts/start-dockerd, scripts/build-images)")


def _sandbox(provider: str) -> dict:
    if provider == "docker":
        _docker_ready()
        return {"provider": "docker", "image": DOCKER_IMAGE}
    return {"provider": "local"}


PROVIDERS = [
    pytest.param("local", marks=pytest.mark.bwrap),
    pytest.param("docker", marks=pytest.mark.docker),
]


@pytest.mark.slow
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("harness", ["serve", "run"])
async def test_default_profile_names_the_rejected_permission_and_pattern(
    task_copy, episode_on, provider, harness
):
    ep = episode_on(task_copy(trajectory=STEPS), sandbox=_sandbox(provider), runtime={"harness": harness})
    seen = _record(ep)
    started = time.monotonic()
    result = await ep.run()
    assert time.monotonic() - started < 60
    assert (result.failure_kind, result.failure_stage, result.failure_class) == (
        "agent_permission_rejected",
        "agent",
        "model",
    ), result.summary
    assert result.action == "count_as_zero" and result.cleanup_confirmed
    (record,) = [e for e in seen if isinstance(e, FailureRecorded)]
    failure = record.failure
    assert "permission `external_directory` for /etc/*" in failure.message
    assert "runtime.permissions = default" in failure.message
    assert isinstance(failure.details, PermissionDetails)
    assert (failure.details.permission, failure.details.patterns) == ("external_directory", ["/etc/*"])
    assert failure.details.profile == "default"
    assert failure.evidence and failure.evidence[0].data["permission"] == "external_directory"
    # The rejection is what the agent's read got back, and the write after it never ran.
    calls = {e.tool: e for e in seen if isinstance(e, ToolCall) and e.status != "running"}
    assert calls["read"].status == "error" and "rejected" in (calls["read"].output or "")
    assert "write" not in calls
    # The same failure, as recorded on disk.
    lines = (Path(result.run_dir) / RunFiles.EVENTS).read_text().splitlines()
    (on_disk,) = [e for e in map(json.loads, lines) if e.get("type") == "failure"]
    assert on_disk["failure"]["details"]["patterns"] == ["/etc/*"]
    if harness == "serve":  # live: the display says so as it happens
        shown = "".join(e.data for e in seen if isinstance(e, TerminalOutput) and e.stream == "display")
        assert "permission requested: external_directory for /etc/* (/etc/passwd); auto-rejected" in shown
        assert failure.details.call_id == calls["read"].call_id


@pytest.mark.slow
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_allow_all_profile_lets_the_read_through_and_scores(task_copy, episode_on, provider):
    ep = episode_on(
        task_copy(trajectory=STEPS), sandbox=_sandbox(provider), runtime={"permissions": "allow-all"}
    )
    seen = _record(ep)
    result = await ep.run()
    assert (result.action, result.reward) == ("scored", 1.0), result.summary
    calls = {e.tool: e for e in seen if isinstance(e, ToolCall) and e.status != "running"}
    assert calls["read"].status == "completed" and "root:" in (calls["read"].output or "")
    assert calls["write"].status == "completed"
    assert not any(isinstance(e, FailureRecorded) for e in seen)
    stdout = (Path(result.run_dir) / RunFiles.OPENCODE_STDOUT).read_text()
    assert '"permission.asked"' not in stdout
