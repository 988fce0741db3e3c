"""The run screen's sandbox prepared ahead (issue 31): `opencode-tui run TASK` starts preparing its
sandbox as the task is read and the episode takes it; when the run ends, the next one is prepared
for `r` (re-run), which takes it; every way out with a prepared, unused sandbox (`q`, Ctrl-C, SIGTERM,
SIGHUP after the run; `c` while the first is being prepared) releases it, confirmed, none left.

Real docker and local (bubblewrap) sandboxes, the real OpenCode binary, the embedded scripted model,
the real app in a pseudo-terminal (tests/opencode_tui/test_tui_pty.py's ``Tui``)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode.warm_next import WarmNext, warm_key
from opencode_tui_core.tasks import load_task
from tests.opencode_tui.test_tui_pty import Tui
from tests.opencode_tui.test_warm_batch import _pooled

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
CLI = [sys.executable, "-m", "opencode_tui.cli"]
WARM_LINE = re.compile(
    r"warm sandboxes: (\d+) prepared, (\d+) used, (\d+) discarded(, \d+ failed)?"
    r"(, \d+ release unconfirmed)?(, \d+ released unused, confirmed)?"
)


def _start(provider: str, tmp_path: Path, *args: str, task: Path | None = None) -> Tui:
    task = task or SAMPLES / "hello-file"
    return Tui(
        ["run", str(task), "--provider", provider, "--runs-dir", str(tmp_path / "runs"), *args], tmp_path
    )


def _runs(tmp_path: Path) -> list[Path]:
    return sorted(p.parent for p in (tmp_path / "runs").glob("*/run.json"))


def _events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


def _pump(t: Tui, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t.pump(0.2)


def _prepared_for_rerun(t: Tui, provider: str, owner: str, tmp_path: Path) -> str:
    """The run has ended (`r` is offered) and a sandbox is prepared for its re-run: its id."""
    t.wait_for(lambda s: "r Re-run" in s, 240, "the ended run's re-run key")
    used = {w["sandbox_id"] for run in _runs(tmp_path) for w in _events(run, "warm_sandbox")}
    deadline, ready = time.monotonic() + 180, False
    while not ready or not (new := [p for p in _pooled(provider, owner) if p not in used]):
        assert time.monotonic() < deadline, f"no sandbox was prepared for the re-run:\n{t.text()}"
        t.pump(0.5)
        ready = ready or "ready for a re-run" in t.text()  # a toast, for 5 s
    return new[0]


def _warm_line(t: Tui) -> tuple[int, int, int, str]:
    """The app's last stderr line about the sandboxes it prepared: prepared, used, discarded, and what
    it says of their release."""
    found = WARM_LINE.search(t.text())
    assert found, f"no warm sandboxes line on stderr:\n{t.text()}"
    prepared, used, discarded, failed, unconfirmed, confirmed = found.groups()
    return int(prepared), int(used), int(discarded), "".join(filter(None, (failed, unconfirmed, confirmed)))


@pytest.mark.slow
def test_the_first_run_and_its_rerun_take_sandboxes_prepared_ahead(provider, tmp_path, test_owner):
    """The first run's sandbox was prepared by the pool (its events say so); after it ended the next
    was prepared for `r`, and the re-run took that one (another sandbox, prepared after the first run
    ended). Then `q`: nothing prepared is left."""
    t = _start(provider, tmp_path)
    try:
        prepared = _prepared_for_rerun(t, provider, test_owner, tmp_path)
        t.child.send("r")
        t.wait_for(lambda s: len(_runs(tmp_path)) == 2, 120, "the re-run's run directory")
        t.wait_for(lambda s: "r Re-run" in s and "scored" in s, 240, "the re-run's end")
        t.child.send("q")
        code = t.exit_code(timeout=150)
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert code == 0, t.text()
    first, second = _runs(tmp_path)
    [warm1], [warm2] = _events(first, "warm_sandbox"), _events(second, "warm_sandbox")
    assert warm1["provider"] == warm2["provider"] == provider
    assert warm2["sandbox_id"] == prepared != warm1["sandbox_id"]
    [outcome1] = _events(first, "outcome")
    assert warm2["prepared_at"] > outcome1["ts"]  # prepared after the first run ended, for the re-run
    for run in (first, second):
        info = json.loads((run / "run.json").read_text())
        assert (
            info["outcome"]["reward"] == 1
            and info["sandbox_id"] == _events(run, "warm_sandbox")[0]["sandbox_id"]
        )
    _, used, _, rest = _warm_line(t)
    assert used == 2 and "unconfirmed" not in rest, rest
    assert _pooled(provider, test_owner) == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["q", "ctrl-c", "SIGTERM", "SIGHUP"])
def test_every_way_out_after_the_run_releases_the_prepared_sandbox(how, provider, tmp_path, test_owner):
    """The run has ended and a sandbox waits prepared for `r`: `q`, Ctrl-C, SIGTERM and SIGHUP each
    release it before the app exits, confirmed. (Nothing runs any more: the exit code is the run's.)"""
    t = _start(provider, tmp_path)
    try:
        prepared = _prepared_for_rerun(t, provider, test_owner, tmp_path)
        assert prepared in _pooled(provider, test_owner)
        if how in ("SIGTERM", "SIGHUP"):
            t.child.kill(signal.Signals[how])
        elif how == "ctrl-c":
            t.child.sendcontrol("c")
        else:
            t.child.send(how)
        code = t.exit_code(timeout=150)
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert code == 0, t.text()
    assert _pooled(provider, test_owner) == []
    assert _warm_line(t) == (2, 1, 1, ", 1 released unused, confirmed"), t.text()


@pytest.mark.slow
def test_c_while_the_first_sandbox_is_prepared_releases_it(provider, tmp_path, test_owner):
    """`c` while the run waits for its sandbox (a cold, private OpenCode cache makes its preparation
    long): the run is cancelled, the sandbox being prepared is released (confirmed) while the app is
    still open, none is prepared for a re-run; then `q`."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"runtime": {"cache_dir": str(tmp_path / "cache")}}))
    t = _start(provider, tmp_path, "--config", str(config))
    try:
        deadline = time.monotonic() + 120
        while not _pooled(provider, test_owner):
            assert time.monotonic() < deadline, "the first sandbox was never created"
            t.pump(0.5)
        [run] = _runs(tmp_path) or [None]
        assert run is not None and _events(run, "warm_sandbox") == [], "the sandbox was ready too soon"
        t.child.send("c")
        t.wait_for(lambda s: "(y)" in s, 15, "the question")
        t.child.send("y")
        deadline, said = time.monotonic() + 150, False
        while not said or _pooled(provider, test_owner):
            assert time.monotonic() < deadline, f"not released after `c` (or not said):\n{t.text()}"
            t.pump(0.5)
            said = said or "prepared ahead was released" in t.text()  # a toast, for 6 s
        _pump(t, 2)
        assert _pooled(provider, test_owner) == []  # and none prepared for a re-run of a cancelled run
        t.child.send("q")
        code = t.exit_code(timeout=150)
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert code == 130, t.text()
    info = json.loads((run / "run.json").read_text())
    assert info["outcome"]["failure_kind"] == "run_cancelled" and info["counts"]["cancelled_by"] == "user"
    assert _warm_line(t) == (0, 0, 1, ", 1 released unused, confirmed"), t.text()
    assert _pooled(provider, test_owner) == []


@pytest.mark.slow
def test_a_sandbox_prepared_for_another_configuration_is_not_given_and_is_released(
    provider, tmp_path, test_owner
):
    """Prepared for one task, then asked for one whose limits differ (another ``pool_key``): it is not
    given (``pool_for`` is None), and aiming at the other releases it, confirmed."""
    other = tmp_path / "other"
    shutil.copytree(SAMPLES / "hello-file", other)
    spec = yaml.safe_load((other / "task.yaml").read_text())
    (other / "task.yaml").write_text(yaml.safe_dump({**spec, "limits": {"memory": "768m"}}))
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}})
    task, changed = load_task(SAMPLES / "hello-file"), load_task(other)
    assert warm_key(task, config) != warm_key(changed, config)

    async def scenario() -> None:
        warm = WarmNext()
        first = await warm.aim(task, config)
        deadline = time.monotonic() + 120
        while warm.counts.prepared < 1:
            assert time.monotonic() < deadline, "nothing was prepared"
            await asyncio.sleep(0.2)
        [ready] = await asyncio.to_thread(_pooled, provider, test_owner)
        assert warm.pool_for(changed, config) is None  # not given to the other task
        second = await warm.aim(changed, config)
        assert second is not None and second is not first
        assert ready not in await asyncio.to_thread(_pooled, provider, test_owner)
        counts = warm.counts
        assert (counts.discarded, counts.released_confirmed, counts.released_unconfirmed) == (1, 1, 0)
        counts = await warm.close()
        assert counts.released_unconfirmed == 0 and counts.used == 0

    asyncio.run(scenario())
    assert _pooled(provider, test_owner) == []


def test_warm_is_off_where_it_does_not_apply():
    """`batch.warm: 0`, a provider without the warm capability, a borrowed sandbox: nothing prepared."""
    task = load_task(SAMPLES / "hello-file")
    on = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    assert warm_key(task, on) is not None and WarmNext().pool_for(task, on) is not None
    for off in (
        {"sandbox": {"provider": "local"}, "batch": {"warm": 0}},
        {"sandbox": {"provider": "opensandbox"}},
        {"sandbox": {"provider": "docker", "mode": "borrowed", "sandbox_id": "x"}},
    ):
        config = AgentConfig.model_validate(off)
        assert warm_key(task, config) is None and WarmNext().pool_for(task, config) is None, off


@pytest.mark.slow
@pytest.mark.bwrap
def test_batch_warm_0_turns_it_off_on_the_run_screen(tmp_path, test_owner):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"batch": {"warm": 0}}))
    t = _start("local", tmp_path, "--config", str(config))
    try:
        t.wait_for(lambda s: "r Re-run" in s, 240, "the ended run")
        _pump(t, 3)
        assert _pooled("local", test_owner) == []
        t.child.send("q")
        code = t.exit_code(timeout=60)
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert code == 0
    [run] = _runs(tmp_path)
    assert _events(run, "warm_sandbox") == []
    assert WARM_LINE.search(t.text()) is None


@pytest.mark.slow
def test_the_served_browsers_rerun_takes_the_prepared_sandbox_and_another_task_does_not(
    provider, tmp_path, test_owner
):
    """A served session (one app: the browser's `r` runs inside it, ``run_here``): the re-run takes the
    sandbox prepared for its run's task after the last run ended (ready: it waited 0 s); back in the
    browser, a re-run of another task (other limits) is not given the one prepared meanwhile, which is
    released, confirmed; `q` releases the last one. (Pilot, not a pseudo-terminal: the same app.)"""
    import subprocess

    from opencode_tui.app import OpenCodeTUI

    runs = tmp_path / "runs"
    other = tmp_path / "other"
    shutil.copytree(SAMPLES / "hello-file", other)
    spec = yaml.safe_load((other / "task.yaml").read_text())
    (other / "task.yaml").write_text(yaml.safe_dump({**spec, "limits": {"memory": "768m"}}))
    recorded = []
    for task in (SAMPLES / "hello-file", other):
        r = subprocess.run(
            [*CLI, "run", str(task), "--batch", "--provider", provider, "--runs-dir", str(runs)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        recorded.append(Path(json.loads(r.stdout.splitlines()[-1])["run_dir"]))
    original, changed = recorded

    async def scenario() -> None:
        warm = WarmNext()
        app = OpenCodeTUI(runs_dir=runs, warm=warm)

        async def until(what: str, predicate, timeout: float = 240) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                assert time.monotonic() < deadline, f"never: {what}"
                await pilot.pause(0.2)

        def ended(n: int) -> bool:
            return len(app.ran) == n and app.episode_done and app.control is not None

        async with app.run_test(size=(160, 48)) as pilot:
            for n in (1, 2):
                app.run_here(original)
                await until(f"re-run {n} ended", lambda n=n: ended(n))
                await until(f"a sandbox prepared after re-run {n}", lambda n=n: warm.counts.prepared == n + 1)
                await pilot.press("escape")  # the run has ended: back to the browser
                await until("the browser", lambda: app.control is None)
            prepared = await asyncio.to_thread(_pooled, provider, test_owner)
            assert len(prepared) == 1
            app.run_here(changed)
            await until("the other task's run ended", lambda: ended(3))
            assert prepared[0] not in await asyncio.to_thread(_pooled, provider, test_owner)
            await until("a sandbox prepared after the other run", lambda: warm.counts.prepared == 4)
            await pilot.press("q")  # the run has ended: back to the browser, then out of the app
            await until("the browser", lambda: app.control is None)
            await pilot.press("q")
            await until("the app's exit", lambda: not app.is_running, 120)
        counts = await warm.close()
        assert counts.released_unconfirmed == 0 and counts.used == 3, counts
        # the mismatched one, and the one prepared after the last run (released on the way out)
        assert counts.discarded == counts.released_confirmed == 2, counts
        warm_events = [_events(Path(e._result.run_dir), "warm_sandbox") for e in app.ran]
        assert all(len(w) == 1 for w in warm_events), warm_events
        second, third = warm_events[1][0], warm_events[2][0]
        assert second["waited_s"] == 0  # prepared while the browser showed, ready when the re-run began
        assert third["sandbox_id"] != prepared[0] and third["pool_run"] != second["pool_run"]

    asyncio.run(scenario())
    assert _pooled(provider, test_owner) == []
