"""The Docker provider's settings: the config's ``sandbox.docker:`` (all optional)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from opencode_tui_core.config import _finite_positive


class DockerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The engine's address (``unix:///var/run/docker.sock``, ``tcp://...``); None: the environment's
    # (``DOCKER_HOST``, else the default socket), as the docker CLI does.
    base_url: str | None = None
    api_timeout_s: float = 60.0  # the SDK's socket timeout for ordinary requests

    @field_validator("api_timeout_s")
    @classmethod
    def _timeout(cls, value: float, info: Any) -> float:
        return _finite_positive(info.field_name, value)
