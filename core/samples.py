"""The sample tasks that ship with the package: where they are, what they are called, copying them.

The repository keeps them in ``sample_tasks/`` next to ``core/`` (the README runs
``opencode-tui run sample_tasks/hello-file`` from a checkout); a wheel carries that same directory as
``core/sample_tasks/`` (setup.py's build step copies it in), so an installed package without a
checkout still has them. A sample's name is its path below that directory: ``hello-file``,
``harbor/hello-world``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from opencode_tui_core.harbor import TASK_TOML
from opencode_tui_core.tasks import TASK_FILE

SAMPLES_DIRNAME = "sample_tasks"
# What each bundled sample ends as, run with two attempts and the embedded scripted model: (action,
# reward, failure kind). The episode tests and the soak benchmark check every run against it.
EXPECTED_OUTCOMES: dict[str, tuple[str, float | None, str | None]] = {
    "hello-file": ("scored", 1.0, None),
    "fix-bug": ("scored", 1.0, None),
    "swe-style": ("scored", 1.0, None),
    "long-context": ("scored", 1.0, None),
    "oom": ("count_as_zero", 0.0, "provider_oom_killed"),
    "exit-137": ("scored", 1.0, None),
    "model-flaky-429": ("scored", 1.0, None),
    "model-flaky-500": ("mark_evaluation_error", None, "model_server_error"),
    "timeout": ("count_as_zero", 0.0, "agent_timeout"),
}
_SKIP = ("__pycache__", "*.pyc")  # pip byte-compiles the samples' .py files at install


def samples_root() -> Path | None:
    """The bundled samples: inside the installed package, else the checkout's ``sample_tasks/``."""
    core_dir = Path(__file__).resolve().parent
    for candidate in (core_dir / SAMPLES_DIRNAME, core_dir.parent / SAMPLES_DIRNAME):
        if candidate.is_dir():
            return candidate
    return None


@dataclass(frozen=True)
class Sample:
    name: str  # its path below the samples directory, e.g. ``hello-file`` or ``harbor/hello-world``
    path: Path
    summary: str  # the first line of what the agent is asked to do


def _summary(task_dir: Path) -> str:
    import yaml

    if (task_dir / TASK_FILE).is_file():
        try:
            data = yaml.safe_load((task_dir / TASK_FILE).read_text())
        except (OSError, yaml.YAMLError):
            return ""
        text = str(data.get("problem_statement", "")) if isinstance(data, dict) else ""
    else:
        try:
            text = (task_dir / "instruction.md").read_text()
        except OSError:
            return ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def list_samples() -> list[Sample]:
    root = samples_root()
    if root is None:
        return []
    found = []
    for marker in (TASK_FILE, TASK_TOML):
        for f in root.rglob(marker):
            if "__pycache__" not in f.parts:
                d = f.parent
                found.append(Sample(name=d.relative_to(root).as_posix(), path=d, summary=_summary(d)))
    return sorted(found, key=lambda s: s.name)


def find_sample(name: str) -> Sample | None:
    return next((s for s in list_samples() if s.name == name), None)


@dataclass(frozen=True)
class TaskRef:
    """What a TASK argument of ``run`` named: a path here, or a bundled sample of that name."""

    path: Path
    sample: Sample | None = None  # set when the bundled sample is used
    shadowed: Sample | None = None  # a bundled sample of that name exists but the path here won


def resolve_task_ref(ref: str) -> TaskRef:
    """A path that exists wins (a directory of that name in the working directory); else a bundled
    sample of that name; else the path as given (loading it then says it does not exist)."""
    here = Path(ref)
    sample = find_sample(ref.rstrip("/"))
    if here.exists():
        return TaskRef(path=here, shadowed=sample)
    if sample is not None:
        return TaskRef(path=sample.path, sample=sample)
    return TaskRef(path=here)


def copy_samples(dest: Path, names: list[str] | None = None) -> list[Path]:
    """Copy the named samples (all by default) under ``dest``, each at its name; refuses before
    copying anything when one is unknown or its target already exists (nothing is overwritten)."""
    samples = list_samples()
    by_name = {s.name: s for s in samples}
    chosen = samples if not names else []
    for n in names or ():
        if n.rstrip("/") not in by_name:
            raise ValueError(f"no bundled sample named {n!r} (list them with `opencode-tui samples`)")
        chosen.append(by_name[n.rstrip("/")])
    if not chosen:
        raise ValueError("this installation has no bundled samples")
    taken = [dest / s.name for s in chosen if (dest / s.name).exists()]
    if taken:
        shown = ", ".join(str(p) for p in taken[:3]) + (" ..." if len(taken) > 3 else "")
        raise FileExistsError(f"{shown} already exists; choose another directory (nothing was copied)")
    out = []
    for s in chosen:
        target = dest / s.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(s.path, target, ignore=shutil.ignore_patterns(*_SKIP))
        out.append(target)
    return out
