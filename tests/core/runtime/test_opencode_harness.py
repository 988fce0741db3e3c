"""The OpenCode harness against the real binary: generated config, what OpenCode actually sends,
faults from the scripted model, and the best-effort/required prerequisites in real images."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.config import ModelSettings
from opencode_tui_core.events import Event, ToolCall, Warning_
from opencode_tui_core.runtime.opencode import build_config
from tests.core.runtime.conftest import SAMPLES


def test_output_cap_does_not_touch_context_window():
    low = build_config(ModelSettings(output_cap=1024), "http://x/v1", None, None)
    default = build_config(ModelSettings(), "http://x/v1", None, None)
    (lo,) = low["provider"]["opencode-tui"]["models"].values()
    (de,) = default["provider"]["opencode-tui"]["models"].values()
    assert lo["limit"] == {"context": 262144, "output": 1024}
    assert de["limit"] == {"context": 262144, "output": 32768}
    assert lo["reasoning"] is True
    assert default["permission"] == {"edit": "allow", "bash": "allow", "webfetch": "deny"}
    assert default["autoupdate"] is False and default["share"] == "disabled"


def _calls(result) -> list[dict]:
    return [
        json.loads(line) for line in (Path(result.run_dir) / RunFiles.MODEL_CALLS).read_text().splitlines()
    ]


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize(
    ("cap", "harness"),
    [(1024, "serve"), (32768, "serve"), (65536, "serve"), (65536, "run")],
)
async def test_max_tokens_follows_the_output_cap_on_the_wire(task_copy, episode_on, cap, harness):
    """OpenCode clamps ``max_tokens`` to 32,000 unless OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX says more:
    the configured cap, above and below that clamp, is what every request carries (title included)."""
    ep = episode_on(task_copy(), model={"output_cap": cap}, runtime={"harness": harness})
    result = await ep.run()
    assert result.action == "scored", result.summary
    calls = _calls(result)
    sent = {
        (c["kind"], c["request_body"].get("max_tokens") or c["request_body"].get("max_completion_tokens"))
        for c in calls
    }
    assert sent == {("agent", cap), ("title", cap)}, sent
    config = json.loads((Path(result.run_dir) / RunFiles.RUN_INFO).read_text())["config"]
    assert config["model"]["context_window"] == 262144


@pytest.mark.slow
@pytest.mark.bwrap
async def test_stall_longer_than_the_client_timeout_is_recorded_and_retried(task_copy, episode_on):
    steps = [
        {
            "tool_calls": [
                {
                    "name": "write",
                    "arguments": {"filePath": "{workdir}/hello.txt", "content": "Hello from OpenCode\n"},
                }
            ],
            "fault": {"stall": 8, "times": 1},
        },
        {"text": "done"},
    ]
    ep = episode_on(task_copy(trajectory=steps), model={"stall_timeout_s": 2})
    result = await ep.run()
    assert result.action == "scored"
    agent = [c for c in _calls(result) if c["kind"] == "agent"]
    assert agent[0]["client_disconnected"] is True  # OpenCode gave up on the stalled stream
    assert agent[1]["status"] == 200


@pytest.mark.slow
@pytest.mark.bwrap
async def test_malformed_stream_ends_the_run_as_a_model_failure(task_copy, episode_on):
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}], "fault": {"malformed": True}},
        {"text": "done"},
    ]
    ep = episode_on(task_copy(trajectory=steps))
    result = await ep.run()
    assert result.failure_kind == "model_malformed_response", result.summary
    assert result.failure_class == "evaluation"
    assert result.cleanup_confirmed


def _docker_ready(image: str) -> None:
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        pytest.skip(f"docker or {image} unavailable (scripts/start-dockerd, scripts/build-images)")


@pytest.mark.slow
@pytest.mark.docker
async def test_image_without_python_fails_with_the_preinstall_message(task_copy, episode_on):
    _docker_ready("opencode-tui/nopython:bookworm")
    ep = episode_on(
        task_copy(),
        sandbox={"provider": "docker", "image": "opencode-tui/nopython:bookworm"},
    )
    result = await ep.run()
    assert (result.failure_kind, result.failure_stage) == ("install_prerequisite_missing", "install")
    assert (
        "Preinstall python3" in result.summary
        or "python3" in (Path(result.run_dir) / RunFiles.DIAGNOSTICS).read_text()
    )
    assert result.action == "mark_evaluation_error"


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("user", [None, "1000:1000"], ids=["root", "uid-1000"])
async def test_an_image_without_ripgrep_gets_the_cached_one_and_opencode_greps_with_it(
    task_copy, episode_on, user
):
    """No rg in the image: a link to the mounted cache's rg (no 6 MB upload per sandbox), which
    OpenCode's grep tool runs, as root and as another user (the cache must be traversable)."""
    _docker_ready("opencode-tui/base-norg:bookworm")
    steps = [
        {"tool_calls": [{"name": "grep", "arguments": {"pattern": "greppable-marker", "path": "{workdir}"}}]},
        *yaml.safe_load((SAMPLES / "hello-file" / "trajectory.yaml").read_text())["steps"],
    ]
    task = task_copy(trajectory=steps, files="files")
    (task / "files").mkdir()
    (task / "files" / "notes.txt").write_text("a greppable-marker line\n")
    sandbox = {"provider": "docker", "image": "opencode-tui/base-norg:bookworm"}
    ep = episode_on(task, sandbox={**sandbox, **({"user": user} if user else {})})
    seen: list[Event] = []
    ep.bus.subscribe(seen.append)
    result = await ep.run()
    assert result.action == "scored", result.summary
    [rg] = [e for e in seen if isinstance(e, Warning_) and e.code.startswith("ripgrep_")]
    assert rg.code == "ripgrep_provisioned" and "a link to the mounted cache" in rg.message, rg.message
    [grep] = [e for e in seen if isinstance(e, ToolCall) and e.tool == "grep" and e.status != "running"]
    assert grep.status == "completed" and "notes.txt" in (grep.output or ""), grep


@pytest.mark.docker
def test_musl_loader_in_a_real_image_is_detected():
    """Debian's `musl` package puts a real musl loader in the image; glibc stays the system libc."""
    _docker_ready("opencode-tui/musl:bookworm")
    from opencode_tui_core.runtime.targets import parse_probe, probe_script, select_target

    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "opencode-tui/musl:bookworm",
            "sh",
            "-c",
            probe_script(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    facts = parse_probe(out.stdout)
    assert facts.musl_loader and "ld-musl" in facts.musl_loader
    assert facts.libc == "glibc" and select_target(facts).libc == "glibc"
    # The same image read as an Alpine would be (ldd says musl): the musl build is chosen.
    alpine_like = facts.model_copy(update={"ldd_version": "musl libc (x86_64)", "gnu_libc_version": None})
    assert select_target(alpine_like).package_name.endswith("-musl")


@pytest.mark.slow
@pytest.mark.parametrize(
    "provider",
    [pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)],
)
async def test_a_sandbox_killed_under_the_install_probe_keeps_the_providers_failure(
    provider, task_copy, episode_on
):
    """A real fault: the moment the install phase starts, the sandbox is killed from outside
    (``docker kill`` of the container; SIGKILL to every process of the local sandbox, its keeper
    included). The probe's exec fails because of the provider, and the record says so: the
    provider's own kind with its cause, stage install; never ``install_prerequisite_missing``."""
    import os
    import signal

    from opencode_tui_core.events import Phase, PhaseChanged

    if provider == "docker":
        _docker_ready("opencode-tui/base:bookworm")
    ep = episode_on(task_copy(), sandbox={"provider": provider})
    killed: list[str] = []

    def kill_at_install(event) -> None:
        if not (isinstance(event, PhaseChanged) and event.phase is Phase.INSTALL) or killed:
            return
        sb = ep.sandbox
        if provider == "docker":
            subprocess.run(["docker", "kill", sb.sandbox_id], capture_output=True, check=True, timeout=60)
        else:
            for pid in sb.host_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        killed.append(sb.sandbox_id)

    ep.bus.subscribe(kill_at_install)
    result = await ep.run()
    assert killed, "the sandbox was never killed"
    failure = next(r.failure for r in ep.failures if r.failure.stage.value == "install")
    # Before: install_prerequisite_missing ("cannot run /bin/sh ...; preinstall a POSIX shell").
    assert failure.kind == "sandbox_lost", failure
    assert result.failure_kind == "sandbox_lost" and result.failure_stage == "install"
    assert "preinstall" not in failure.message.lower()
    if provider == "docker":  # the engine's answer is kept as the cause
        assert failure.cause is not None and "409" in failure.cause.message
