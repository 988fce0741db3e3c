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
    limits: {memory: 256m, cpus: 1, run_s: 600, pids: 1024, disk: 2g}   # optional
    model: {trajectory: trajectory.yaml}
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opencode_tui_core.config import (
    DEFAULT_IMAGE,
    REFUSED_TASK_FIELDS,
    ConfigError,
    SandboxLimits,
    format_validation_error,
    parse_memory,
    parse_user_spec,
    yaml_error_text,
)


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
    # Where those files go instead of the workdir (absolute; Harbor tasks: /tests).
    files_target: str | None = None
    # A flat JSON object of named rewards, read when reward_file does not exist (Harbor's
    # reward.json): its "reward" key, or its only value.
    reward_json: str | None = None
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
    # Override the config's ``limits.pids`` / ``limits.disk`` (see opencode_tui_core.config.SandboxLimits).
    pids: int | None = Field(default=None, ge=1)
    disk: str | int | None = None

    @field_validator("memory", "disk")
    @classmethod
    def _memory(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_memory(value)
        return value

    def pids_limit(self, config: SandboxLimits) -> int | None:
        """The sandbox's process limit: the task's, else the config's."""
        return self.pids if self.pids is not None else config.pids

    def disk_bytes(self, config: SandboxLimits) -> int | None:
        """The sandbox's writable space in bytes: the task's, else the config's (None: unlimited)."""
        disk = self.disk if self.disk is not None else config.disk
        return None if disk is None else parse_memory(disk)

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_memory(self.memory)


class BuildSpec(_Model):
    """An image built from a Dockerfile (docker provider only), tagged by the hash of its context."""

    context: str = Field(min_length=1)  # directory, relative to the task directory
    dockerfile: str = "Dockerfile"  # relative to the context
    timeout: float = Field(default=600.0, gt=0, allow_inf_nan=False)


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
    # Build the image from a Dockerfile (Harbor tasks' environment/); ``image`` is then its tag.
    build: BuildSpec | None = None
    root: Path = Field(default=Path("."), exclude=True)
    # Which file format the task was read from, and what loading it had to say (unknown fields).
    format: Literal["yaml", "harbor"] = Field(default="yaml", exclude=True)
    load_warnings: list[str] = Field(default_factory=list, exclude=True)

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

    @field_validator("verify")
    @classmethod
    def _files_target(cls, value: VerifySpec) -> VerifySpec:
        if value.files_target is not None and not value.files_target.startswith("/"):
            raise ValueError(f"verify.files_target {value.files_target!r} must be an absolute path")
        return value

    @property
    def build_context(self) -> Path | None:
        return None if self.build is None else (self.root / self.build.context)

    @property
    def verify_files_target(self) -> str:
        return self.verify.files_target or self.workdir

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
    """Load a task from its directory (``task.yaml``, or a Harbor directory with ``task.toml``) or its
    ``task.yaml``; errors name the file and the field."""
    p = Path(path)
    from opencode_tui_core.harbor import TASK_TOML, is_harbor_dir

    if is_harbor_dir(p) or (p.name == TASK_TOML and p.is_file()):
        return with_build_tag(load_harbor_task(p if p.is_dir() else p.parent))
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
    for name, why in REFUSED_TASK_FIELDS.items():
        if name in data:
            raise ConfigError(f"{file}: field '{name}' is refused: {why}")
    try:
        task = Task.model_validate({**data, "root": file.parent.resolve()})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(file))) from exc
    check_task_refs(task, file)
    return with_build_tag(task)


def check_task_refs(task: Task, file: Path) -> None:
    """Every file or directory the task names exists (errors name the task file and the field)."""
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
    if task.build is not None:
        ctx = task.build_context
        assert ctx is not None
        if not ctx.is_dir():
            raise ConfigError(f"{file}: build.context: {ctx} must be a directory")
        if not (ctx / task.build.dockerfile).is_file():
            raise ConfigError(f"{file}: build.dockerfile: {ctx / task.build.dockerfile} does not exist")


def tree_hash(root: Path, *, skip: tuple[str, ...] = ()) -> str:
    """sha256 over every file under ``root``: relative path, executable bit and content, in order.

    Symlinks count by their target text (a build context or task directory is hashed as written).
    """
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0")
            if full.is_symlink():
                h.update(b"L" + os.readlink(full).encode() + b"\0")
                continue
            h.update(b"X" if os.access(full, os.X_OK) else b"-")
            with full.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def with_build_tag(task: Task) -> Task:
    """A task built from a Dockerfile runs the image tagged by its context's hash (the cache key)."""
    if task.build is None:
        return task
    ctx = task.build_context
    assert ctx is not None
    tag = f"opencode-tui/task-{task.id.lower()}:{tree_hash(ctx)[:16]}"
    return task.model_copy(update={"image": tag})


def task_content_hash(task: Task) -> str:
    """What the task is, by content: every file of its directory (the task file included)."""
    return tree_hash(task.root, skip=(".git", "__pycache__"))


def render_prompt(task: Task) -> str:
    """The user prompt: problem statement, then requirements and interface as their own sections."""
    sections = [("Problem statement", task.problem_statement)]
    if task.requirements:
        sections.append(("Requirements", task.requirements))
    if task.interface:
        sections.append(("Interface", task.interface))
    body = "\n\n".join(f"## {title}\n\n{text.strip()}" for title, text in sections)
    return f"{body}\n\nWork in {task.workdir}.\n"


def load_harbor_task(root: Path) -> Task:
    """A Harbor task directory (core/harbor.py reads it) as a Task (``load_warnings`` holds the field
    warnings)."""
    from opencode_tui_core.harbor import TASK_TOML, harbor_task_data

    root = root.resolve()
    fields, warnings = harbor_task_data(root)
    try:
        task = Task.model_validate({**fields, "root": root, "format": "harbor", "load_warnings": warnings})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(root / TASK_TOML))) from exc
    check_task_refs(task, root / TASK_TOML)
    return task
