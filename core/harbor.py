"""Harbor (Terminal-Bench) task directories, read as this project's Task.

A Harbor task directory holds ``task.toml``, ``instruction.md`` (the problem statement),
``environment/Dockerfile`` (or ``[environment] docker_image`` naming a prebuilt image), ``tests/``
with ``test.sh``, and optionally ``solution/``. Facts of the format (Harbor's task config and trial
paths): ``[verifier] timeout_sec`` (default 600), ``[agent] timeout_sec``, ``[environment]
build_timeout_sec`` (default 600), ``cpus``, ``memory_mb`` (or the older ``memory = "2G"``); the tests
are copied to ``/tests`` only after the agent has finished and run as ``bash /tests/test.sh``; the
reward is a float in ``/logs/verifier/reward.txt``, or a flat JSON object of named rewards in
``/logs/verifier/reward.json``.

How it maps (see docs/task-format.md): the instruction → ``problem_statement``; the Dockerfile →
``build`` (built by core/image_build.py, tagged by the hash of its context); ``tests/`` →
``verify.files`` uploaded to ``/tests`` after confirmed cleanup; the verifier runs as root unless
``[verifier] user`` says otherwise, with ``reward_file``/``reward_json`` at Harbor's paths. The
scripted model's trajectory (for offline runs) may be named in ``[metadata.opencode_tui]
trajectory``. Fields this project does not know are a warning naming them, never an error: the
format evolves.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from opencode_tui_core.config import ConfigError

TASK_TOML = "task.toml"
INSTRUCTION = "instruction.md"
TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
REWARD_TXT = f"{VERIFIER_LOGS}/reward.txt"
REWARD_JSON = f"{VERIFIER_LOGS}/reward.json"
DEFAULT_WORKDIR = "/app"

# Fields of Harbor's task.toml this project reads.
_APPLIED: dict[str, set[str]] = {
    "": {
        "version",
        "schema_version",
        "task",
        "metadata",
        "verifier",
        "agent",
        "environment",
        "solution",
        "source",
    },
    "verifier": {"timeout_sec", "env", "user"},
    "agent": {"timeout_sec", "user"},
    "environment": {"build_timeout_sec", "docker_image", "cpus", "memory_mb", "memory"},
}
# Fields Harbor defines that this project does not apply (said in a warning when present).
_NOT_APPLIED: dict[str, set[str]] = {
    "verifier": {"network_mode", "allowed_hosts"},
    "agent": {"network_mode", "allowed_hosts"},
    "environment": {
        "storage_mb",
        "storage",
        "gpus",
        "gpu_types",
        "allow_internet",
        "network_mode",
        "allowed_hosts",
        "mcp_servers",
        "env",
        "skills_dir",
        "healthcheck",
        "os",
    },
    "solution": {"env"},
}


def is_harbor_dir(path: Path) -> bool:
    return path.is_dir() and (path / TASK_TOML).exists() and not (path / "task.yaml").exists()


def _field_warnings(data: dict[str, Any]) -> list[str]:
    unknown: list[str] = []
    ignored: list[str] = []
    for key, value in data.items():
        if key not in _APPLIED[""]:
            unknown.append(key)
        elif key in _APPLIED or key in _NOT_APPLIED:
            if not isinstance(value, dict):
                continue
            for sub in value:
                name = f"{key}.{sub}"
                if sub in _APPLIED.get(key, set()):
                    continue
                (ignored if sub in _NOT_APPLIED.get(key, set()) else unknown).append(name)
    out = []
    if unknown:
        out.append(f"unknown task.toml field(s) ignored: {', '.join(sorted(unknown))}")
    if ignored:
        out.append(f"task.toml field(s) not applied by opencode-tui: {', '.join(sorted(ignored))}")
    return out


def _workdir(dockerfile: Path) -> str:
    """The Dockerfile's last absolute ``WORKDIR`` (Harbor has no workdir field), else /app."""
    workdir = DEFAULT_WORKDIR
    try:
        lines = dockerfile.read_text(errors="replace").splitlines()
    except OSError:
        return workdir
    for line in lines:
        m = re.match(r"\s*WORKDIR\s+(\S+)\s*$", line, re.IGNORECASE)
        if m and m.group(1).startswith("/") and "$" not in m.group(1):
            workdir = str(PurePosixPath(m.group(1)))
    return workdir


def _task_id(data: dict[str, Any], root: Path) -> str:
    name = (data.get("task") or {}).get("name") if isinstance(data.get("task"), dict) else None
    raw = str(name).split("/")[-1] if name else root.name
    ident = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.") or "harbor-task"
    return ident if ident[0].isalnum() else f"t{ident}"


def _memory(env: dict[str, Any]) -> str | None:
    if isinstance(env.get("memory_mb"), int | float) and env["memory_mb"] > 0:
        return f"{int(env['memory_mb'])}m"
    if isinstance(env.get("memory"), str):
        return env["memory"].strip().lower()
    return None


def harbor_task_data(root: Path) -> tuple[dict[str, Any], list[str]]:
    """The Task fields (as task.yaml would hold them) of a Harbor task directory, and warnings."""
    file = root / TASK_TOML
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"task file {file} is not valid TOML: {exc}") from exc
    instruction = root / INSTRUCTION
    if not instruction.is_file():
        raise ConfigError(f"{root}: a Harbor task directory must contain {INSTRUCTION}")
    tests = root / "tests"
    if not (tests / "test.sh").is_file():
        raise ConfigError(f"{root}: a Harbor task directory must contain tests/test.sh")
    for section in ("verifier", "agent", "environment", "metadata"):
        if section in data and not isinstance(data[section], dict):
            raise ConfigError(f"{file}: [{section}] must be a table")
    verifier: dict[str, Any] = data.get("verifier") or {}
    agent: dict[str, Any] = data.get("agent") or {}
    env: dict[str, Any] = data.get("environment") or {}
    meta: dict[str, Any] = (data.get("metadata") or {}).get("opencode_tui") or {}

    fields: dict[str, Any] = {
        "id": _task_id(data, root),
        "problem_statement": instruction.read_text(encoding="utf-8"),
    }
    dockerfile = root / "environment" / "Dockerfile"
    if env.get("docker_image"):
        fields["image"] = str(env["docker_image"])
        fields["workdir"] = str(meta.get("workdir") or DEFAULT_WORKDIR)
    elif dockerfile.is_file():
        fields["build"] = {
            "context": "environment",
            "dockerfile": "Dockerfile",
            "timeout": float(env.get("build_timeout_sec", 600.0)),
        }
        fields["workdir"] = str(meta.get("workdir") or _workdir(dockerfile))
    else:
        raise ConfigError(
            f"{root}: neither environment/Dockerfile nor [environment] docker_image: the task has no image"
        )
    # The verifier: Harbor's test.sh writes its reward under /logs/verifier, which must exist.
    exports = "".join(
        f"export {k}={shlex.quote(str(v))}; "
        for k, v in (verifier.get("env") or {}).items()
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k))
    )
    fields["verify"] = {
        "command": f"{exports}mkdir -p {VERIFIER_LOGS} && bash {TESTS_DIR}/test.sh",
        "timeout": float(verifier.get("timeout_sec", 600.0)),
        "reward_file": REWARD_TXT,
        "reward_json": REWARD_JSON,
        "files": "tests",
        "files_target": TESTS_DIR,
        "user": str(verifier["user"]) if verifier.get("user") is not None else "root",
    }
    limits: dict[str, Any] = {}
    if isinstance(env.get("cpus"), int | float) and env["cpus"] > 0:
        limits["cpus"] = env["cpus"]
    if _memory(env):
        limits["memory"] = _memory(env)
    if isinstance(agent.get("timeout_sec"), int | float) and agent["timeout_sec"] > 0:
        limits["run_s"] = float(agent["timeout_sec"])
    if limits:
        fields["limits"] = limits
    if agent.get("user") is not None:
        fields["user"] = str(agent["user"])
    if meta.get("trajectory"):
        fields["model"] = {"trajectory": str(meta["trajectory"])}
    return fields, _field_warnings(data)


def reward_from_json(text: str) -> float:
    """Harbor's reward.json: a flat object of named rewards; the ``reward`` key, or its only value."""
    import json

    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("reward.json must hold a JSON object")
    value = doc.get("reward") if "reward" in doc else (next(iter(doc.values())) if len(doc) == 1 else None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"reward.json has no numeric 'reward' (keys: {', '.join(map(str, doc)) or 'none'})")
    return float(value)


async def read_reward(sandbox: Any, task: Any) -> tuple[str | None, str | None]:
    """The reward file's text, or why it could not be read: ``reward_file`` first, then (when the
    task names one and the first does not exist) ``reward_json``'s reward."""
    v = task.verify

    def where(p: str) -> str:
        return p if p.startswith("/") else f"{task.workdir}/{p}"

    try:
        return (await sandbox.download_file(where(v.reward_file))).decode("utf-8", "replace"), None
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}"
    if not v.reward_json:
        return None, first
    try:
        text = (await sandbox.download_file(where(v.reward_json))).decode("utf-8", "replace")
    except Exception as exc:
        return None, f"{first}; {v.reward_json}: {type(exc).__name__}: {exc}"
    try:
        return repr(reward_from_json(text)), None
    except ValueError as exc:
        return None, f"{v.reward_json}: {exc}"
