"""``opencode-tui samples`` and ``run NAME``, and the package as a user without a checkout gets it: a
wheel built from this tree, installed into a fresh venv, running a bundled sample from an empty
directory (real pip, real venv, real local sandbox, the task's scripted model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheel import build_wheel, clean_env
from tests.wheel import run as run_ok

CLI = [sys.executable, "-m", "opencode_tui.cli"]


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_samples_lists_and_run_of_an_unknown_name_is_one_line(tmp_path: Path) -> None:
    listed = _cli("samples", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert "hello-file" in names and "harbor/hello-world" in names
    bad = _cli("run", "hello-fil", "--batch", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "no bundled sample of that name" in bad.stderr
    assert "opencode-tui samples" in bad.stderr and not (tmp_path / "runs").exists()
    copied = _cli("samples", "copy", str(tmp_path / "mine"), "hello-file", cwd=tmp_path)
    assert copied.returncode == 0 and (tmp_path / "mine" / "hello-file" / "task.yaml").is_file()
    again = _cli("samples", "copy", str(tmp_path / "mine"), "hello-file", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.timeout(900)
def test_a_wheel_in_a_fresh_venv_runs_a_bundled_sample_from_an_empty_directory(tmp_path: Path) -> None:
    env = clean_env()
    wheel = build_wheel(tmp_path)
    # The installed dependencies are reused (system site-packages); the wheel's own modules must be
    # the ones that run, never a checkout's.
    venv = tmp_path / "venv"
    run_ok(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    py, tui = venv / "bin" / "python", venv / "bin" / "opencode-tui"
    run_ok(
        [str(py), "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    # Its dependencies are met (other packages' complaints about the host's site-packages are not ours).
    check = subprocess.run(
        [str(py), "-m", "pip", "check"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert "opencode-tui" not in check.stdout, check.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    listed = run_ok([str(tui), "samples"], cwd=empty, env=env, timeout=60)
    assert "hello-file" in listed.stdout and str(venv) in listed.stderr  # the copy inside the package

    # doctor runs from the wheel alone: every module of ours it loaded comes from the venv.
    probe = (
        "import json, sys\n"
        "from opencode_tui.cli import main\n"
        "rc = main(['doctor', '--json'])\n"
        "ours = {m.__name__: getattr(m, '__file__', None) or '' for m in list(sys.modules.values())\n"
        "        if getattr(m, '__name__', '').split('.')[0] in ('opencode_tui_core', 'opencode_tui')}\n"
        "print(json.dumps({'rc': rc, 'ours': ours}))\n"
    )
    doctor = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, timeout=300, cwd=empty, env=env
    )
    *checks, last = doctor.stdout.strip().splitlines()
    report = json.loads(last)
    assert report["rc"] in (0, 3), doctor.stderr  # 3: a provider this host lacks is a failed check
    assert {json.loads(c)["name"] for c in checks} >= {"python", "opencode pin"}
    outside = {n: f for n, f in report["ours"].items() if f and not f.startswith(str(venv))}
    assert report["ours"] and not outside, outside

    run = run_ok(
        [str(tui), "run", "hello-file", "--batch", "--provider", "local", "--runs-dir", "runs"],
        cwd=empty,
        env=env,
        timeout=600,
    )
    assert "the bundled sample" in run.stderr and str(venv) in run.stderr
    [line] = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert line["task_id"] == "hello-file" and line["reward"] == 1.0, line
    assert sorted(p.name for p in empty.iterdir()) == ["runs"]  # nothing else written where the user stood
