"""Build step beyond pyproject.toml: the wheel carries the repository's sample tasks.

``sample_tasks/`` stays at the top of the repository (the README and the tests run
``sample_tasks/hello-file`` from a checkout); the wheel gets the same files as ``opencode_tui_core/sample_tasks/``,
where ``opencode_tui_core.samples`` looks first. One copy in the repository, copied at build time.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SAMPLES = Path(__file__).resolve().parent / "sample_tasks"


class BuildPyWithSamples(build_py):
    def run(self) -> None:
        super().run()
        # An editable install reads them from the checkout itself (opencode_tui_core.samples falls back to it).
        if getattr(self, "editable_mode", False) or not SAMPLES.is_dir():
            return
        target = Path(self.build_lib) / "opencode_tui_core" / "sample_tasks"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(SAMPLES, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithSamples})
