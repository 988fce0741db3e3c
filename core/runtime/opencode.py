"""Running OpenCode in a sandbox: private layout, generated config, the harness command (the serve
runner, or ``opencode run --format json``), its live stream handed to ``opencode_tui_core.runtime.stream``, and the
artifacts collected after confirmed cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.artifacts import RunDir, RunFiles
from opencode_tui_core.config import AgentConfig, ModelSettings, PermissionProfile
from opencode_tui_core.events import Event, SandboxFault, TerminalOutput, TranscriptStats
from opencode_tui_core.failures import Evidence, FailureEvent, FailureStage, PermissionDetails
from opencode_tui_core.inside import INSIDE_DIR
from opencode_tui_core.inside.serve_runner import (
    AHEAD,
    AHEAD_SESSION,
    GO_NAME,
    HANDOFF_TOKEN_ENV,
    PROMPT_NAME,
    RELAY_PORT_ENV,
)
from opencode_tui_core.json_text import indented_json
from opencode_tui_core.runtime import transcript
from opencode_tui_core.runtime.access import SESSION_DIR_MODE
from opencode_tui_core.runtime.stream import RejectedPermission, RunStreamTranslator, ServeStreamTranslator
from opencode_tui_core.sandbox.base import SANDBOX_MODEL_SOCKET, OutputChunk, Sandbox, SandboxError
from opencode_tui_core.sandbox.tarsafe import safe_extract, tree_tar
from opencode_tui_core.tasks import TASK_FILE, Task, render_prompt

# OpenCode's output in the run directory (the names are spelled in opencode_tui_core.artifacts.RunFiles).
STDOUT_FILE = RunFiles.OPENCODE_STDOUT
STDERR_FILE = RunFiles.OPENCODE_STDERR
OUTPUT_LOG_FILE = RunFiles.OPENCODE_OUTPUT_LOG
EXPORT_FILE = RunFiles.OPENCODE_EXPORT
DATABASE_FILE = RunFiles.OPENCODE_DB

PLUGIN_SOURCE = INSIDE_DIR / "attribution_plugin.js"
RUNNER_SOURCE = INSIDE_DIR / "serve_runner.py"
RELAY_PORT = 47331  # inside the sandbox's own network namespace, so any fixed port is free

PROVIDER_ID = "opencode-tui"
# The proxy injects the real upstream key. OpenCode presents the episode's token (ModelEndpoint);
# this placeholder only where an endpoint has none.
PLACEHOLDER_API_KEY = "opencode-tui-proxy"

# OpenCode's environment switches: no self-update, no sharing, no project config, no network fetches.
OPENCODE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
}

# OpenCode's model catalogue (models.dev): a file standing for it, holding no provider. Without one, OpenCode
# builds the snapshot compiled into it (every provider and model, each validated) at the first prompt:
# measured on 1.18.32 (hello-file, serve, host), about 1.1 CPU-s of its main thread before the first model
# call and 1.7 CPU-s in all, per episode. The catalogue only fills in providers the config leaves out;
# ours (``PROVIDER_ID``) is defined in full by ``build_config`` (model, limits, capabilities), and the
# sandbox holds no other provider's key. An empty JSON object is a catalogue OpenCode accepts as loaded.
MODELS_PATH_ENV = "OPENCODE_MODELS_PATH"
EMPTY_CATALOGUE = b"{}\n"

# OpenCode sends ``max_tokens = min(limit.output, this or 32000)`` (agent, title and compaction calls
# alike; it also reserves that much of the context window before compacting). Set to the configured
# output cap so the cap reaches the wire unclamped.
OUTPUT_TOKEN_MAX_ENV = "OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX"

# OpenCode's ``permission`` config per ``runtime.permissions`` profile, whatever the model provider.
# ``default``: the agent may edit and run commands in its sandbox without asking (nobody is there to
# answer); OpenCode's other asks stay (external_directory, doom_loop, reading ``.env`` files) and are
# rejected. ``allow-all``: ``"*": "allow"`` — OpenCode merges the user's rules after its own and the last
# matching rule wins, so nothing is asked (what harnesses that skip permission prompts configure).
# Never a web fetch, in either (later keys win).
WEB_DENIED = {"webfetch": "deny"}
PERMISSION_PROFILES: dict[PermissionProfile, dict[str, str]] = {
    "default": {"edit": "allow", "bash": "allow", **WEB_DENIED},
    "allow-all": {"*": "allow", **WEB_DENIED},
}


@dataclass(frozen=True)
class RuntimeLayout:
    """OpenCode's private files inside the sandbox, all under one session directory."""

    session_dir: str

    def _p(self, *parts: str) -> str:
        return "/".join([self.session_dir, *parts])

    @property
    def bin_dir(self) -> str:
        return self._p("bin")

    @property
    def home(self) -> str:
        return self._p("home")

    @property
    def xdg(self) -> dict[str, str]:
        return {f"XDG_{k.upper()}_HOME": self._p("xdg", k) for k in ("config", "data", "cache", "state")}

    @property
    def data_dir(self) -> str:
        return self._p("xdg", "data", "opencode")

    @property
    def plugin_file(self) -> str:
        return self._p("plugin", "attribution.js")

    @property
    def instructions_file(self) -> str:
        return self._p("instructions.md")

    @property
    def config_file(self) -> str:
        return self._p("opencode.json")

    @property
    def relay_file(self) -> str:
        return self._p("relay.py")

    @property
    def runner_file(self) -> str:
        return self._p("serve_runner.py")

    @property
    def output_log(self) -> str:
        return self._p("output.log")

    @property
    def models_file(self) -> str:
        return self._p("models.json")


def build_config(
    model: ModelSettings,
    base_url: str,
    plugin_file: str | None,
    instructions_file: str | None,
    permissions: PermissionProfile = "default",
    api_key: str = PLACEHOLDER_API_KEY,
) -> dict:
    """OpenCode's config: one provider (the recording proxy), independent context and output limits.

    ``api_key`` is what OpenCode presents to the proxy: the episode's token (the real upstream key
    never enters the sandbox; the proxy adds it)."""
    entry: dict[str, Any] = {
        "name": model.name,
        # Independent on purpose: lowering the output cap never shrinks the context window.
        "limit": {"context": model.context_window, "output": model.output_cap},
        "reasoning": model.thinking,
        "tool_call": True,
    }
    cfg: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"{PROVIDER_ID}/{model.name}",
        "small_model": f"{PROVIDER_ID}/{model.name}",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "opencode-tui recording proxy",
                "options": {
                    "baseURL": base_url,
                    "apiKey": api_key,
                    "timeout": int(model.request_timeout_s * 1000),
                    "chunkTimeout": int(model.stall_timeout_s * 1000),
                },
                "models": {model.name: entry},
            }
        },
        "permission": dict(PERMISSION_PROFILES[permissions]),
    }
    if plugin_file:
        cfg["plugin"] = [f"file://{plugin_file}"]
    if instructions_file:
        cfg["instructions"] = [instructions_file]
    return cfg


class OpenCodeHarness:
    """Everything about one OpenCode run in one sandbox."""

    def __init__(self, run_id: str, task: Task, config: AgentConfig, endpoint: Any) -> None:
        self.task = task
        self.config = config
        self.endpoint = endpoint
        # Directly in /tmp (sticky, writable by all): a non-root sandbox user can create and later
        # rename/remove its own session dir there, with no shared parent directory to own.
        self.layout = RuntimeLayout(f"/tmp/.opencode-tui-{run_id}")
        # The sandbox user's (uid, gid), set by the episode once known: staged files are theirs.
        self.owner: tuple[int, int] | None = None
        self.use_relay = (
            config.sandbox.network.value == "model-only"
            and getattr(endpoint, "unix_path", None)
            and config.sandbox.mode == "owned"
            and registry.get(config.sandbox.provider).capabilities.model_socket
        )
        self.base_url = f"http://127.0.0.1:{RELAY_PORT}/v1" if self.use_relay else f"{endpoint.tcp_url}/v1"
        self.mode = config.runtime.harness
        self._stream: RunStreamTranslator | ServeStreamTranslator = (
            ServeStreamTranslator(task.workdir, self.layout.data_dir)
            if self.mode == "serve"
            else RunStreamTranslator(task.workdir)
        )
        self._stdout_log: Any = None

    # ---- staging ----
    def prompt_bytes(self) -> bytes:
        return render_prompt(self.task).encode()

    def record_inputs(self, run_dir: RunDir) -> None:
        """What OpenCode is given, exactly as it is sent into the sandbox: the prompt on its stdin,
        the instructions file its config names, and the task file it came from (redacted, like every
        file in the run directory)."""
        run_dir.write_text(RunFiles.PROMPT, self.prompt_bytes().decode())
        if self.task.instructions:
            run_dir.write_text(RunFiles.INSTRUCTIONS, self.task.instructions)
        task_file = self.task.root / TASK_FILE
        try:
            run_dir.write_text(RunFiles.TASK_YAML, task_file.read_text(encoding="utf-8"))
        except OSError as exc:  # a task built in code has no file; the run goes on either way
            if task_file.exists():
                run_dir.write_failed(task_file, exc)

    def config_dict(self) -> dict:
        instructions = self.layout.instructions_file if self.task.instructions else None
        return build_config(
            self.config.model,
            self.base_url,
            self.layout.plugin_file,
            instructions,
            self.config.runtime.permissions,
            getattr(self.endpoint, "access_token", None) or PLACEHOLDER_API_KEY,
        )

    def staged_files(self, runtime: Any = None) -> dict[str, tuple[bytes | None, int]]:
        """Everything OpenCode needs in the session dir, relative to it (``None``: a directory);
        with the prepared ``runtime``, also OpenCode's first-run state (opencode_tui_core.runtime.first_run)."""
        rel = len(self.layout.session_dir) + 1
        files: dict[str, tuple[bytes | None, int]] = {
            d[rel:]: (None, 0o700) for d in [self.layout.home, self.layout.bin_dir, *self.layout.xdg.values()]
        }
        for path in getattr(runtime, "first_run_files", None) or ():
            # Its database, migrated and empty: OpenCode skips the migrations of a first start.
            try:
                files[f"{self.layout.data_dir[rel:]}/{Path(path).name}"] = (Path(path).read_bytes(), 0o600)
            except OSError:
                pass  # gone from the cache since the install phase: OpenCode builds its own
        files[self.layout.config_file[rel:]] = (indented_json(self.config_dict()).encode(), 0o600)
        files[self.layout.models_file[rel:]] = (EMPTY_CATALOGUE, 0o600)
        files[self.layout.plugin_file[rel:]] = (PLUGIN_SOURCE.read_bytes(), 0o644)
        if self.task.instructions:
            files[self.layout.instructions_file[rel:]] = (self.task.instructions.encode(), 0o644)
        # Stop OpenCode from npm-installing ``@opencode-ai/plugin`` into its config dir: with any plugin
        # configured it waits for that install before loading plugins, and offline (a model-only
        # sandbox) the fetch only times out after ~70 s. It skips the install when the directory has
        # ``node_modules`` and a lock file covering package.json; our plugin imports nothing.
        cfg_dir = self.layout.xdg["XDG_CONFIG_HOME"][rel:] + "/opencode"
        deps = {"@opencode-ai/plugin": self.config.runtime.opencode_version}
        lock = {
            "name": "opencode",
            "lockfileVersion": 3,
            "requires": True,
            "packages": {"": {"dependencies": deps}},
        }
        files[f"{cfg_dir}/package.json"] = (json.dumps({"dependencies": deps}).encode(), 0o644)
        files[f"{cfg_dir}/package-lock.json"] = (json.dumps(lock).encode(), 0o644)
        files[f"{cfg_dir}/node_modules/.opencode-tui"] = (b"dependencies provided offline\n", 0o644)
        if self.mode == "serve":
            files[self.layout.runner_file[rel:]] = (RUNNER_SOURCE.read_bytes(), 0o644)
        if self.use_relay:
            from opencode_tui_core.inside.relay import RELAY_SCRIPT_PATH

            files[self.layout.relay_file[rel:]] = (Path(RELAY_SCRIPT_PATH).read_bytes(), 0o644)
        return files

    async def stage(self, sandbox: Sandbox) -> None:
        """Lay out config, plugin, instructions, relay and the private HOME/XDG dirs in one upload."""
        root_mode = SESSION_DIR_MODE if self.owner is not None else None
        archive = tree_tar(self.staged_files(), owner=self.owner, root_mode=root_mode)
        await sandbox.upload_tar(self.layout.session_dir, archive)

    def task_files(self) -> dict[str, tuple[bytes | None, int]]:
        """For a server started ahead (``command(ahead=…)``): the task's prompt and instructions, then
        the file that starts it, in one upload into the session dir (in this order: the runner takes
        the prompt once the last one exists)."""
        rel = len(self.layout.session_dir) + 1
        files: dict[str, tuple[bytes | None, int]] = {}
        if self.task.instructions:
            files[self.layout.instructions_file[rel:]] = (self.task.instructions.encode(), 0o644)
        files[PROMPT_NAME] = (self.prompt_bytes(), 0o600)
        files[GO_NAME] = (b"", 0o600)
        return files

    def command(self, runtime: Any, ahead: str | None = None) -> tuple[list[str], dict[str, str]]:
        """The harness argv (run under the supervisor) and its environment. ``ahead``
        (``AHEAD``/``AHEAD_SESSION``, serve only): the runner starts the server before its task
        exists and waits for ``task_files``."""
        q = shlex.quote
        lines = [f"cd {q(self.task.workdir)} || exit 2"]
        if self.use_relay:
            # The relay is the sandbox's only way out (to the model proxy's Unix socket). It is a
            # child of this shell, hence drained by the supervisor with everything else. Its stderr
            # is the harness's: streamed out and kept in the output log by the supervisor.
            lines.append(
                f"{q(runtime.python)} -I {q(self.layout.relay_file)} {RELAY_PORT} {q(SANDBOX_MODEL_SOCKET)} "
                "</dev/null >/dev/null &"
            )
        if self.use_relay and self.mode == "serve":
            # The serve runner waits for the relay itself, once `opencode serve` listens (which takes
            # far longer than the relay's start): the two start side by side.
            lines.append(f"export {RELAY_PORT_ENV}={RELAY_PORT}")
        elif self.use_relay:
            lines += [
                "i=0",
                f'while ! {q(runtime.python)} -c \'import socket,sys; socket.create_connection(("127.0.0.1", '
                f"{RELAY_PORT}), 1)' 2>/dev/null; do",
                "  i=$((i+1)); [ $i -ge 100 ] && { echo 'opencode-tui: the model relay did not start' >&2; exit 3; }",
                "  sleep 0.1",
                "done",
            ]
        if self.mode == "serve":
            flag = f"{ahead} " if ahead in (AHEAD, AHEAD_SESSION) else ""
            lines.append(
                f"exec {q(runtime.python)} -I {q(self.layout.runner_file)} {flag}{q(runtime.binary)}"
            )
        else:
            lines.append(f"exec {q(runtime.binary)} run --format json")
        env = {
            "HOME": self.layout.home,
            **self.layout.xdg,
            **OPENCODE_ENV,
            "OPENCODE_CONFIG": self.layout.config_file,
            MODELS_PATH_ENV: self.layout.models_file,
            OUTPUT_TOKEN_MAX_ENV: str(self.config.model.output_cap),
            "PATH": f"{self.layout.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
        }
        token = getattr(self.endpoint, "access_token", None)
        if ahead in (AHEAD, AHEAD_SESSION) and self.use_relay and token:
            env[HANDOFF_TOKEN_ENV] = (
                token  # the task comes through the relay (opencode_tui_core.episode.handoff)
            )
        return ["/bin/sh", "-c", "\n".join(lines)], env

    # ---- live output ----
    def on_output(self, emit: Callable[[Event], Any], run_dir: RunDir) -> Callable[[OutputChunk], None]:
        """Each chunk goes to the run directory as it arrives (stdout raw, stderr redacted), then to
        the event stream: unconfirmed cleanup or a destroyed sandbox cannot take it back."""
        stdout_path = run_dir.path / STDOUT_FILE
        try:
            run_dir.sub(str(Path(STDOUT_FILE).parent))
            self._stdout_log = stdout_path.open("ab")
        except OSError as exc:  # a failing runs directory never breaks the run (the run dir says so)
            run_dir.write_failed(stdout_path, exc)

        def handle(chunk: OutputChunk) -> None:
            if chunk.stream == "stdout" and self._stdout_log is not None:
                try:
                    self._stdout_log.write(chunk.data)
                    self._stdout_log.flush()
                except OSError as exc:
                    run_dir.write_failed(stdout_path, exc)
            text = chunk.data.decode("utf-8", "replace")
            if chunk.stream == "stderr":
                run_dir.append_text(STDERR_FILE, text)
            emit(TerminalOutput(stream=chunk.stream, data=text))
            if chunk.stream == "stdout":
                for event in self._stream.feed(chunk.data):
                    emit(event)

        return handle

    def on_fault(self, fault: SandboxFault, when: str) -> list[Event]:
        """What the terminal shows for a kernel kill or a full disk seen live (see the translator)."""
        return self._stream.fault(fault, when)

    def flush(self, emit: Callable[[Event], Any]) -> None:
        for event in self._stream.close():
            emit(event)
        if self._stdout_log is not None:
            with contextlib.suppress(OSError):
                self._stdout_log.close()
            self._stdout_log = None

    @property
    def finished_cleanly(self) -> bool:
        return self._stream.finished_cleanly

    @property
    def last_error(self) -> str | None:
        return self._stream.last_error

    @property
    def rejected_permissions(self) -> list[RejectedPermission]:
        """Permissions OpenCode asked for and nobody granted, in order (serve: live; run: from its
        stderr log once collected)."""
        return list(self._stream.rejected_permissions)

    def permission_failure(self) -> FailureEvent | None:
        """``agent_permission_rejected`` for the first rejected permission (OpenCode ends the turn after
        a rejection), or None when nothing was rejected."""
        rejected = self._stream.rejected_permissions
        if not rejected:
            return None
        first, profile = rejected[0], self.config.runtime.permissions
        more = f" ({len(rejected)} permission requests rejected in all)" if len(rejected) > 1 else ""
        return FailureEvent(
            kind="agent_permission_rejected",
            stage=FailureStage.AGENT,
            operation="run opencode",
            message=f"OpenCode asked for permission {first.describe()}; nobody can answer, so it was "
            f"rejected and the turn ended{more}. Permission profile: runtime.permissions = {profile}"
            + ("; allow-all lets the agent proceed without asking" if profile == "default" else ""),
            details=PermissionDetails(
                permission=first.permission,
                patterns=first.patterns,
                profile=profile,
                call_id=first.call_id,
                rejected_total=len(rejected),
            ),
            evidence=[
                Evidence(
                    source="opencode.permission.asked" if self.mode == "serve" else "opencode.run.stderr",
                    scope=r.session_id,
                    data=r.model_dump(exclude_none=True),
                )
                for r in rejected
            ],
        )

    # ---- after confirmed cleanup ----
    async def collect(self, sandbox: Sandbox, run_dir: RunDir) -> None:
        """Bring OpenCode's database files and the supervisor log into the run directory."""
        run_dir.sub(RunFiles.OPENCODE_DIR)

        async def output_log() -> str | None:
            try:
                return (await sandbox.download_file(self.layout.output_log)).decode("utf-8", "replace")
            except (SandboxError, FileNotFoundError):
                return None

        # Both downloads at once (each is a round trip to the backend); the database's failure is
        # raised once both have ended.
        log, archive = await asyncio.gather(
            output_log(), sandbox.download_tar(self.layout.data_dir), return_exceptions=True
        )
        if isinstance(log, BaseException):
            raise log
        if isinstance(log, str):
            run_dir.write_text(OUTPUT_LOG_FILE, log)
            self._stream.feed_log(log)
        if isinstance(archive, BaseException):
            raise archive
        raw = run_dir.path / RunFiles.OPENCODE_DATA
        safe_extract(archive, raw)

    def export_transcript(self, run_dir: RunDir) -> TranscriptStats:
        raw = run_dir.path / RunFiles.OPENCODE_DATA / "opencode"
        db = transcript.snapshot(raw, run_dir.path / DATABASE_FILE)
        doc, stats = transcript.export(db)
        run_dir.write_json(EXPORT_FILE, doc)
        return stats
