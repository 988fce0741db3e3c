"""Building this tree's wheel the way a user's ``pip wheel`` / ``pip install`` does (shared by the
packaging and the bundled-samples tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What the build reads; copied so that the build's own output (build/, *.egg-info) never lands in
# the checkout. ``opencode_tui_core`` is the link to core/: copied, it becomes a plain directory.
BUILD_INPUTS = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "core",
    "opencode_tui_core",
    "opencode_tui",
    "sample_tasks",
)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    assert r.returncode == 0, f"{argv} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of this tree, built by the real pip; its path."""
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(dist)],
        cwd=tmp_path,
        env=clean_env(),
        timeout=600,
    )
    [wheel] = dist.glob("opencode_tui-*.whl")
    return wheel
