"""The in-sandbox programs of core/inside/ run as programs, from their files, on this host: the stop
script under dash (a strict POSIX shell, as in Debian images) and the verifier wrapper under the
system python3, with their parameters as arguments, the way the engine runs them in a sandbox.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_tui_core.inside import INSIDE_DIR
from opencode_tui_core.runtime import supervisor_client as sc
from opencode_tui_core.runtime.verify_wrapper import VERIFY_WRAPPER_SOURCE

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the programs are Linux only"),
    pytest.mark.timeout(60),
]

STOP = INSIDE_DIR / "stop.sh"
WRAPPER = INSIDE_DIR / "verify_wrapper.py"
SHELL = shutil.which("dash") or "/bin/sh"
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def test_the_engine_runs_the_files_it_ships():
    argv = sc.stop_script("/tmp/s", 1)
    assert argv[:3] == ["/bin/sh", "-c", STOP.read_text()]
    assert VERIFY_WRAPPER_SOURCE == WRAPPER.read_text()


def _stop_argv(session: Path, timeout: float) -> list[str]:
    """The engine's argv, with the program given as a file (``sh FILE args``) instead of ``-c``."""
    argv = sc.stop_script(str(session), timeout)
    return [SHELL, str(STOP), *argv[4:]]


def test_stop_before_any_launch_fences_it_with_a_synthetic_confirmed_receipt(tmp_path):
    session = tmp_path / "session"
    session.mkdir()
    r = subprocess.run(_stop_argv(session, 1), capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    receipt = sc.parse_receipt(r.stdout)
    assert receipt.cleanup_confirmed and receipt.return_code is None
    assert (session / sc.CLAIM_FILE).is_symlink() and (
        session / sc.CLAIM_FILE
    ).readlink().name == sc.CLAIM_STOP
    assert (session / sc.STOP_FILE).exists()


def test_stop_without_a_session_directory_is_unconfirmed(tmp_path):
    r = subprocess.run(_stop_argv(tmp_path / "missing", 1), capture_output=True, text=True, timeout=20)
    assert r.returncode == sc.STOP_UNCONFIRMED_EXIT_CODE
    assert "session directory is missing" in r.stderr and r.stdout == ""


def test_stop_waits_for_a_launch_that_won_and_says_how_long(tmp_path):
    session = tmp_path / "session"
    session.mkdir()
    (session / sc.CLAIM_FILE).symlink_to(sc.CLAIM_LAUNCH)  # a launch claimed it; no supervisor answers
    r = subprocess.run(_stop_argv(session, 0.6), capture_output=True, text=True, timeout=20)
    assert r.returncode == sc.STOP_UNCONFIRMED_EXIT_CODE
    assert "no confirmed cleanup receipt within 0.6s" in r.stderr


def test_stop_prints_a_receipt_that_already_confirms_cleanup(tmp_path):
    session = tmp_path / "session"
    session.mkdir()
    text = json.dumps({"cleanup_confirmed": True, "return_code": 4, "descendants_killed": 2})
    (session / sc.RECEIPT_FILE).write_text(text + "\n")
    r = subprocess.run(_stop_argv(session, 1), capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and sc.parse_receipt(r.stdout).return_code == 4
    assert not (session / sc.STOP_FILE).exists()  # nothing requested: it was over


@pytest.mark.parametrize(
    ("command", "status", "exit_code"),
    [
        pytest.param("exit 0", {"exit_code": 0, "signal": None}, 0, id="passes"),
        pytest.param("exit 137", {"exit_code": 137, "signal": None}, 137, id="exit-137-is-an-exit"),
        pytest.param('kill -9 "$$"', {"exit_code": None, "signal": 9}, 137, id="killed-is-a-signal"),
    ],
)
def test_verify_wrapper_tells_an_exit_from_a_signal(tmp_path, command, status, exit_code):
    path = tmp_path / "status.json"
    r = subprocess.run([PYTHON, str(WRAPPER), command, str(path)], capture_output=True, timeout=20)
    assert r.returncode == exit_code
    assert json.loads(path.read_text()) == status
    assert not Path(f"{path}.tmp").exists()


def test_verify_wrapper_is_python38_stdlib_only():
    tree = ast.parse(WRAPPER.read_text(), feature_version=(3, 8))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= set(sys.stdlib_module_names)
