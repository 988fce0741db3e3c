"""A provider from another package, registered only through the ``opencode_tui.providers`` entry point.

tests/toy_provider is laid out as a separate distribution (its own pyproject.toml). The fixture puts it
on the path the way ``pip install`` would: a ``toy_provider-0.1.0.dist-info`` with the entry points
read from that pyproject.toml, next to the package. Everything then runs in subprocesses, so the
registry of this test process never sees the toy. Nothing in core/ or opencode_tui/ names it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment whose Python finds the toy provider's distribution (and this repository first)."""
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    site = tmp_path_factory.mktemp("site")
    dist = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site), str(HERE)])
    env["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))  # the toy's sandboxes live here
    return env


def _run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_toy_passes_the_provider_contract_suite(toy_env: dict[str, str], tmp_path: Path) -> None:
    """The suite shipped in the package, as a third party runs it: ``doctor --provider-contract`` from a
    directory of its own (no ``tests/`` of this repository, no pytest settings of it)."""
    r = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "doctor", "--provider-contract", "toy"],
        cwd=tmp_path,
        env=toy_env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "the toy provider passes the contract suite" in r.stderr
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|skipped|failed|error)", r.stdout))
    # Every contract test ran against the toy, and was skipped only by capability: exactly those
    # needing what the toy does not declare.
    assert counts.get("passed", 0) >= 15 and "failed" not in counts and "error" not in counts, r.stdout
    skipped = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED")]
    assert counts.get("skipped") == len(skipped) == 3, r.stdout
    for capability in ("model_socket", "pty", "users"):
        assert any(f"the toy provider does not declare {capability}" in s for s in skipped), skipped


def test_a_failing_provider_fails_the_contract_suite(toy_env: dict[str, str], tmp_path: Path) -> None:
    """The suite can fail: a toy whose exec reports the wrong exit status (a real change to its
    behaviour, through the environment variable the toy reads) fails, and doctor exits 3."""
    env = {**toy_env, "TOY_PROVIDER_BREAK_EXIT_CODES": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "doctor", "--provider-contract", "toy"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-2000:]
    assert "the toy provider FAILS the contract suite" in r.stderr
    assert "test_create_exec_release" in r.stdout


def test_the_cli_offers_the_toy_and_doctor_runs_its_preflight(toy_env: dict[str, str]) -> None:
    helped = _run(toy_env, "-m", "opencode_tui.cli", "run", "--help")
    assert helped.returncode == 0
    assert re.search(r"--provider \{[^}]*\btoy\b[^}]*\}", helped.stdout), helped.stdout

    doctor = _run(toy_env, "-m", "opencode_tui.cli", "doctor", "--json")
    checks = [json.loads(line) for line in doctor.stdout.splitlines() if line.startswith("{")]
    toy = [c for c in checks if c["name"] == "toy bwrap"]
    assert toy and toy[0]["status"] == "ok", doctor.stdout + doctor.stderr

    swept = _run(toy_env, "-m", "opencode_tui.cli", "sweep", "--provider", "toy", "--dry-run", "--kept")
    assert swept.returncode == 0, swept.stderr
    assert "would remove 0 sandbox(es)" in swept.stderr


def test_without_its_distribution_the_toy_is_unknown(toy_env: dict[str, str]) -> None:
    env = {**toy_env, "PYTHONPATH": str(REPO)}
    r = _run(env, "-m", "opencode_tui.cli", "sweep", "--provider", "toy", "--dry-run")
    assert r.returncode == 2 and "invalid choice: 'toy'" in r.stderr
    cfg = _run(
        env,
        "-c",
        "from opencode_tui_core.config import AgentConfig; AgentConfig.model_validate({'sandbox': {'provider': 'toy'}})",
    )
    assert (
        cfg.returncode != 0
        and "unknown sandbox provider 'toy'; registered: docker, local, opensandbox" in cfg.stderr
    )


def test_a_broken_plugin_is_reported_and_breaks_nothing_else(toy_env: dict[str, str], tmp_path: Path) -> None:
    """An entry point whose object is missing: doctor and a config naming it say why; other commands work."""
    site = tmp_path / "site"
    dist = site / "broken_provider-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-provider\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[opencode_tui.providers]\nbroken = toy_provider:NOT_THERE\n")
    env = {**toy_env, "PYTHONPATH": os.pathsep.join([toy_env["PYTHONPATH"], str(site)])}

    helped = _run(env, "-m", "opencode_tui.cli", "sweep", "--help")
    assert helped.returncode == 0 and "broken" in helped.stdout, helped.stderr

    doctor = _run(env, "-m", "opencode_tui.cli", "doctor", "--json")
    checks = {c["name"]: c for c in map(json.loads, filter(None, doctor.stdout.splitlines()))}
    assert checks["broken"]["status"] == "fail" and "cannot be loaded" in checks["broken"]["detail"]
    assert checks["toy bwrap"]["status"] == "ok"
    assert doctor.returncode != 0  # a failed check is a failed doctor

    cfg = _run(
        env,
        "-c",
        "from opencode_tui_core.config import load_config; load_config(None, {'sandbox': {'provider': 'broken'}})",
    )
    assert (
        "sandbox.provider: sandbox provider 'broken' (toy_provider:NOT_THERE) cannot be loaded" in cfg.stderr
    )
