"""Task files (``<task dir>/task.yaml``) and prompt rendering.

Format (see docs/task-format.md)::

    id: fix-bug
    problem_statement: |            # required
      ...
    requirements: |                 # optional
    interface: |                    # optional
    image: opencode-tui/base:bookworm
    workdir: /app                   # absolute; not / or /tmp; no '..'
    files: files                    # directory (relative to the task dir) copied into the workdir
    verify:
      command: python3 -m pytest -q
      timeout: 120
      reward_file: null             # optional: a file in the sandbox holding a float reward
      files: hidden                 # optional: hidden tests, copied in only after cleanup
    limits: {memory: 256m, cpus: 1, run_s: 600}   # optional
    model: {trajectory: trajectory.yaml}
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.config import DEFAULT_IMAGE, ConfigError, format_validation_error, parse_user_spec, yaml_error_text

_MEMORY = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory(value: str | int) -> int:
    """``"256m"``, ``"1GiB"``, ``268435456`` → bytes."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("memory must be > 0 bytes")
        return value
    m = _MEMORY.match(value)
    if not m:
        raise ValueError(f"memory {value!r} is not a size like 256m, 1g or a number of bytes")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError("memory must be > 0 bytes")
    return n


def _check_user(value: str | None) -> str | None:
    if value is not None:
        parse_user_spec(value)
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VerifySpec(_Model):
    command: str = Field(min_length=1)
    timeout: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    reward_file: str | None = None
    # Hidden test files, copied into the workdir only after the agent's cleanup is confirmed.
    files: str | None = None
    # Who runs the verifier: None is the sandbox user (as the agent); "root" for tasks whose tests
    # need it (Harbor-style tasks run their verifier as root).
    user: str | None = None

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return _check_user(value)


class Limits(_Model):
    memory: str | int | None = None
    cpus: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Caps the configured run budget for this task (the smaller of the two applies).
    run_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_memory(value)
        return value

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_memory(self.memory)


class ModelSpec(_Model):
    trajectory: str | None = None


class Task(_Model):
    """One task, as read from ``task.yaml``; ``root`` is the directory it was read from."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    problem_statement: str = Field(min_length=1)
    requirements: str | None = None
    interface: str | None = None
    image: str = DEFAULT_IMAGE
    workdir: str = "/app"
    files: str | None = None
    verify: VerifySpec
    limits: Limits = Field(default_factory=Limits)
    model: ModelSpec = Field(default_factory=ModelSpec)
    instructions: str | None = None
    # The sandbox user (a name, uid or uid:gid) when the image's own user is not the right one.
    user: str | None = None
    root: Path = Field(default=Path("."), exclude=True)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return _check_user(value)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        p = PurePosixPath(value)
        if not p.is_absolute():
            raise ValueError(f"workdir {value!r} must be an absolute path")
        if ".." in p.parts:
            raise ValueError(f"workdir {value!r} must not contain '..'")
        if str(p) in ("/", "/tmp"):
            raise ValueError(f"workdir {value!r} is not allowed: use a dedicated directory such as /app")
        return str(p)

    @property
    def files_dir(self) -> Path | None:
        return None if self.files is None else (self.root / self.files)

    @property
    def verify_files_dir(self) -> Path | None:
        return None if self.verify.files is None else (self.root / self.verify.files)

    @property
    def trajectory_path(self) -> Path | None:
        return None if self.model.trajectory is None else (self.root / self.model.trajectory)


TASK_FILE = "task.yaml"  # in a task directory


def load_task(path: str | Path) -> Task:
    """Load a task from its directory or its ``task.yaml``; errors name the file and the field."""
    p = Path(path)
    file = p / TASK_FILE if p.is_dir() else p
    if not file.exists():
        hint = " (a task directory must contain task.yaml)" if p.is_dir() else ""
        raise ConfigError(f"task file {file} does not exist{hint}")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"task file {file} is not valid YAML: {yaml_error_text(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"task file {file} must hold a mapping (id, problem_statement, verify, ...)")
    try:
        task = Task.model_validate({**data, "root": file.parent.resolve()})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(file))) from exc
    refs = (
        ("files", task.files_dir),
        ("verify.files", task.verify_files_dir),
        ("model.trajectory", task.trajectory_path),
    )
    for label, ref in refs:
        if ref is not None and not ref.exists():
            raise ConfigError(f"{file}: {label}: {ref} does not exist")
    for label, ref in refs[:2]:
        if ref is not None and not ref.is_dir():
            raise ConfigError(f"{file}: {label}: {ref} must be a directory")
    return task


def render_prompt(task: Task) -> str:
    """The user prompt: problem statement, then requirements and interface as their own sections."""
    sections = [("Problem statement", task.problem_statement)]
    if task.requirements:
        sections.append(("Requirements", task.requirements))
    if task.interface:
        sections.append(("Interface", task.interface))
    body = "\n\n".join(f"## {title}\n\n{text.strip()}" for title, text in sections)
    return f"{body}\n\nWork in {task.workdir}.\n"
