"""Trajectory files: what the scripted model answers, step by step (YAML, validated, unknown fields refused).

A trajectory is a list of agent steps (or a mapping with ``steps`` and a few global settings)::

    title: Write hello.txt              # optional: the answer to OpenCode's title request
    context_usage: {base: 1500, per_turn: 400}   # optional: synthesised prompt usage (see below)
    steps:
      - tool_calls:
          - name: write                 # OpenCode tool names: bash, read, write, edit, glob, grep, ...
            arguments: {filePath: "{workdir}/hello.txt", content: "hello\\n"}
        usage: {prompt_tokens: 1200, completion_tokens: 40}
      - tool_calls:
          - name: bash
            arguments: {command: "cat hello.txt", description: "Show the file"}
        fault: {status: 429, times: 2}  # answer 429 twice, then serve the step
      - text: Done, hello.txt is written.

Step fields: ``text`` (assistant text; a step without tool calls is a final answer), ``tool_calls``,
``usage`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``reasoning_tokens``), ``fault``
(one of ``status``, ``stall``, ``malformed``, ``drop``, ``empty``, applied to the first ``times`` attempts at the
step), ``delay`` (seconds before the first byte).

Subagents: a step may call OpenCode's ``task`` tool (``{description, prompt, subagent_type}``); the child
session it starts is answered from ``subagents`` — ``[{prompt: <the same prompt>, steps: [...]}]`` — and
gets ``final_text`` once its steps are done. A child with no matching script would get the parent's steps.

Placeholders: ``{name}`` inside string arguments is replaced when the model is given a value for
``name`` (e.g. ``{workdir}``); other braces are left alone, so code in arguments needs no escaping.

Usage: a step's explicit ``usage`` wins. Otherwise prompt usage is synthesised from the request like a real
model's: ``base + per_turn * <assistant turns in the request>``, so it falls after a compaction (the
compacted history is short). To force a compaction, give one step a huge ``prompt_tokens`` (at or above
the context window minus the output cap); that step is served once, the next step comes after the summary.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opencode_tui_core.config import ConfigError, format_validation_error, yaml_error_text


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCallSpec(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    arguments: dict[str, Any] = Field(default_factory=dict)


class Usage(_Model):
    """Token usage the model reports for one call; ``None`` fields are left out of the usage chunk."""

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)


class Fault(_Model):
    """A failure injected on the first ``times`` attempts at a step; then the step is served normally.

    ``status``: answer this HTTP status with an OpenAI-style error body (``retry_after`` adds a header).
    ``stall``: send the first chunk, then nothing for ``stall`` seconds, then the rest.
    ``malformed``: send a chunk that is not valid JSON, then end the stream.
    ``drop``: send the first chunk, then close the connection without ending the stream.
    ``empty``: answer HTTP 200 with an empty body (what llama.cpp's server sends when its chat format
    raises inside a stream).
    """

    status: int | None = Field(default=None, ge=400, le=599)
    stall: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    malformed: bool = False
    drop: bool = False
    empty: bool = False
    times: int = Field(default=1, ge=1)
    retry_after: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    message: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Fault:
        chosen = [
            n
            for n, on in (
                ("status", self.status is not None),
                ("stall", self.stall is not None),
                ("malformed", self.malformed),
                ("drop", self.drop),
                ("empty", self.empty),
            )
            if on
        ]
        if len(chosen) != 1:
            raise ValueError(
                "a fault needs exactly one of status, stall, malformed, drop, empty"
                + (f" (got {', '.join(chosen)})" if chosen else "")
            )
        if self.retry_after is not None and self.status is None:
            raise ValueError("retry_after only applies to a status fault")
        return self

    @property
    def kind(self) -> str:
        if self.status is not None:
            return f"status_{self.status}"
        if self.stall is not None:
            return "stall"
        if self.empty:
            return "empty"
        return "malformed" if self.malformed else "drop"


class Step(_Model):
    text: str | None = None
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    reasoning: str | None = None
    usage: Usage | None = None
    fault: Fault | None = None
    delay: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _something(self) -> Step:
        if not self.tool_calls and not (self.text and self.text.strip()):
            raise ValueError("a step needs tool_calls or a non-empty text")
        return self

    @property
    def final(self) -> bool:
        return not self.tool_calls


class ContextUsage(_Model):
    """Synthesised prompt usage for steps without explicit ``usage.prompt_tokens``."""

    base: int = Field(default=1500, ge=0)
    per_turn: int = Field(default=400, ge=0)
    completion_tokens: int = Field(default=40, ge=0)


class Subagent(_Model):
    """The script of a subagent: the child session OpenCode's ``task`` tool starts with ``prompt``.

    A request belongs to it when its first user message starts with ``prompt`` (placeholders filled in,
    as in the task call's arguments); its steps are served in
    their own sequence (tool-call ids ``call_a{j}s{k}_{i}``, ``j`` its index), so parent and child each
    keep their place."""

    prompt: str = Field(min_length=1)
    steps: list[Step] = Field(min_length=1)
    final_text: str = "Done."


class Trajectory(_Model):
    steps: list[Step] = Field(min_length=1)
    title: str = "Scripted task"
    final_text: str = "Done."
    summary: str | None = None
    context_usage: ContextUsage = Field(default_factory=ContextUsage)
    subagents: list[Subagent] = Field(default_factory=list)

    @field_validator("title")
    @classmethod
    def _title(cls, value: str) -> str:
        value = value.strip()
        if not value or "\n" in value:
            raise ValueError("title must be one non-empty line")
        return value

    @classmethod
    def from_data(cls, data: Any, where: str = "trajectory") -> Trajectory:
        if isinstance(data, list):
            data = {"steps": data}
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a trajectory is a list of steps or a mapping with 'steps'")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, where)) from exc

    @classmethod
    def from_yaml(cls, text: str, where: str = "trajectory") -> Trajectory:
        try:
            # libyaml's parser where PyYAML has it (a trajectory is read per episode: ~10x faster);
            # a text it refuses is read again by the pure one, whose words the error keeps.
            data = yaml.load(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{where} is not valid YAML: {yaml_error_text(exc)}") from exc
        return cls.from_data(data, where)


_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_trajectory(path: str | Path) -> Trajectory:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read trajectory file {p}: {exc.strerror or exc}") from exc
    return Trajectory.from_yaml(text, str(p))


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill_placeholders(value: Any, values: dict[str, str]) -> Any:
    """Replace ``{name}`` in strings (recursively) for names in ``values``; leave other braces alone."""
    if not values:
        return value
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: fill_placeholders(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_placeholders(v, values) for v in value]
    return value
