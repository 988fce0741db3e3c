"""A rerun or fork asked for in the TUI, kept apart from ``lineage_command`` (which opens the app to run
it): the app and its screens name the request without importing the command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict


class LineageRequest(BaseModel):
    """A rerun or fork asked for in the TUI (``R``/``F`` on a replay): run live once the app has
    closed (one episode per app), by ``lineage_in_tui``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: Path
    lineage: Literal["rerun", "fork"]
    at: int | None = None
    model_url: str | None = None
    model: str | None = None
    say: str | None = None

    def args(self) -> argparse.Namespace:
        """As the command line would give them."""
        return argparse.Namespace(
            command=self.lineage,
            run_dir=str(self.run_dir),
            at=self.at,
            on_divergence="stop",
            model_url=self.model_url,
            model=self.model,
            api_key_env=None,
            say=self.say,
            provider=None,
            runs_dir=None,
            allow_changed_task=False,
            batch=False,
        )
