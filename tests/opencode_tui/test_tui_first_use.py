"""What a new user met (issue 26, "Broken"): each case as the user met it. The commands run as real
processes (in a pseudo-terminal through pexpect, the screen read back with pyte, where a terminal
matters); the screens are driven by Pilot over the recorded fixture runs or a real episode on the local
provider (the real OpenCode, the scripted model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pyte
import pytest

from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.modals import ModelCallScreen
from opencode_tui.screens.runs import RunsList, RunsScreen
from opencode_tui.screens.warning_detail import WarningDetailScreen
from opencode_tui.state import RunState
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.header import RunHeader
from opencode_tui.widgets.progress import WarningsBar
from opencode_tui.widgets.timeline import Timeline
from opencode_tui_core.artifacts import RunDir, RunDirReader
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.events import (
    HealthWarning,
    ModelCall,
    TerminalOutput,
    Warning_,
)
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.runtime.stream import ServeStreamTranslator
from opencode_tui_core.tasks import load_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STORM = FIXTURES / "more-runs" / "compaction-storm"
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
COLS, ROWS = 160, 45
ALT_SCREEN = b"\x1b[?1049h"  # what a full-screen app sends first


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color", **extra}


class Pty:
    """``opencode-tui ARGS`` in a pseudo-terminal: its screen (pyte) and every byte it wrote."""

    def __init__(self, *args: str, cwd: Path, cols: int = COLS, rows: int = ROWS) -> None:
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.output = b""
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "opencode_tui.cli", *args],
            cwd=str(cwd),
            dimensions=(rows, cols),
            env=_env(COLUMNS=str(cols), LINES=str(rows)),
        )

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def pump(self, seconds: float = 0.2) -> bool:
        """Read what is there; False once the process has closed its terminal."""
        try:
            data = self.child.read_nonblocking(1 << 16, timeout=seconds)
        except pexpect.TIMEOUT:
            return True
        except pexpect.EOF:
            return False
        self.output += data
        self.stream.feed(data)
        return True

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pump():
                raise AssertionError(f"the app exited before {what}:\n{self.text()}")
            if predicate(self.text()):
                return
        raise AssertionError(f"never saw {what}; the screen:\n{self.text()}")

    def exit_code(self, timeout: float = 90) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pump():
            pass
        self.child.close(force=True)
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


# ---- 2: a runs directory that is a file ----------------------------------------------------------


@pytest.mark.parametrize("where", ["itself", "parent"])
def test_a_runs_dir_that_is_a_file_is_refused_before_the_screen_opens(tmp_path: Path, where: str) -> None:
    """In a terminal: one line, exit 2, and the app never started (it opened, showed "starting pending",
    and said "File exists" only after `q`, exit 3)."""
    blocker = tmp_path / "runs-file"
    blocker.write_text("not a directory\n")
    runs = blocker if where == "itself" else blocker / "runs"
    t = Pty("run", "hello-file", "--provider", "local", "--runs-dir", str(runs), cwd=tmp_path)
    try:
        code = t.exit_code(timeout=60)
    finally:
        t.close()
    assert code == ExitCode.USAGE, t.output
    assert ALT_SCREEN not in t.output, "the screen opened"
    said = [line for line in t.output.decode().splitlines() if "not a directory" in line]
    assert len(said) == 1 and str(runs) in said[0] and "choose another --runs-dir" in said[0], t.output
    assert blocker.read_text() == "not a directory\n"


def test_batch_with_a_runs_dir_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    """--batch: exit 2 with the right hint (it said "free space or choose another --runs-dir", exit 3)."""
    blocker = tmp_path / "runs-file"
    blocker.write_text("")
    r = cli("run", "hello-file", "--batch", "--provider", "local", "--runs-dir", str(blocker))
    assert r.returncode == ExitCode.USAGE, r.stderr
    assert r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if not line.startswith("opencode-tui run: hello-file:")]
    assert len(lines) == 1 and "not a directory" in lines[0] and "choose another --runs-dir" in lines[0]
    assert "free space" not in r.stderr


# ---- 4: the kept sandbox's hint ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.bwrap
def test_a_kept_sandbox_exit_hint_names_attach_and_sweep_and_both_work(tmp_path: Path) -> None:
    """The TUI with --keep-sandbox: on exit it says `opencode-tui attach RUN_DIR` and `opencode-tui sweep
    ID` (it said `sweep --provider local`, which removes nothing kept); both commands, run as printed,
    do what the line says."""
    runs = tmp_path / "runs"
    t = Pty(
        "run", "hello-file", "--provider", "local", "--keep-sandbox", "--runs-dir", str(runs), cwd=tmp_path
    )
    try:
        t.wait_for(lambda s: "scored" in s, 180, "the run's outcome")
        t.child.send("q")
        code = t.exit_code()
    finally:
        t.close()
    assert code == 0, t.output[-2000:]
    [run_dir] = list(runs.iterdir())
    sandbox_id = RunDirReader(run_dir).info().sandbox_id
    try:
        lines = [line for line in t.output.decode().splitlines() if "was kept for debugging" in line]
        assert len(lines) == 1, t.output[-2000:]
        assert f"`opencode-tui attach {run_dir}`" in lines[0]
        assert f"`opencode-tui sweep {sandbox_id}`" in lines[0]
        assert "--provider" not in lines[0]
        attach = subprocess.run(
            [sys.executable, "-m", "opencode_tui.cli", "attach", str(run_dir)],
            input="echo kept-$((6*7)); exit\n",
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
        assert attach.returncode == 0 and "kept-42" in attach.stdout, attach.stderr
    finally:
        swept = cli("sweep", sandbox_id)  # as the hint says (and whatever failed above)
    assert swept.returncode == 0, swept.stderr
    gone = cli("attach", str(run_dir))
    assert gone.returncode == ExitCode.USAGE, gone.stderr


# ---- 5: replay playback from the cursor, its label -----------------------------------------------


async def test_replay_p_plays_from_the_cursor(fixture_runs, replay_loaded, wait) -> None:
    """`[`/timeline to an event mid-run, then `p`: the recording plays from that moment (the screen as
    it was then, the cursor where it was), not from the start."""
    run = fixture_runs / "oom"
    events = list(RunDirReader(run).events())
    cast = RunDirReader(run).cast()
    assert cast is not None and cast.frames
    # the agent's command as the terminal showed it, 9 s into the 30 s recording
    mid = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, TerminalOutput) and e.stream == "display" and "python3 -c" in e.data
    )
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        screen.seek(mid)
        await pilot.pause()
        await pilot.press("p")
        assert screen.playing and screen.play_source == "cast"
        origin = cast.origin(RunDirReader(run).info().started_at)
        at = events[mid].ts.timestamp() - origin
        assert screen.play_clock >= at - 0.1 and screen.play_frame > 0, (screen.play_clock, at)
        assert screen.cursor is not None and screen.cursor >= mid - 5  # never back at the start
        shown = screen.terminal._plain(0, screen.terminal.line_count)
        assert any("$ python3 -c" in line for line in shown), (
            shown
        )  # the frames up to that moment are on screen at once
        await pilot.press("p")  # pause; p again resumes where it paused
        paused_at = screen.play_frame
        await pilot.press("p")
        assert screen.play_frame >= paused_at


async def test_timeline_label_shows_terminal_text_without_escape_codes(fixture_runs, replay_loaded) -> None:
    run = fixture_runs / "oom"
    events = list(RunDirReader(run).events())
    styled = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, TerminalOutput) and "\x1b[" in e.data and e.data.strip()
    )
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        app.screen.seek(styled)
        await pilot.pause()
        label = app.screen.query_one(Timeline).render().plain
        assert "␛" not in label and "\x1b" not in label and "[0m" not in label and "[2m" not in label, label


# ---- 6: the compaction banner --------------------------------------------------------------------


def test_compaction_banner_says_the_context_the_next_call_measured() -> None:
    """The recorded compaction-storm run's OpenCode events, rendered again: after each compaction the
    terminal says the next call's context, the same number the health warning names (it said
    "250,050 → 68 tokens", 68 being the summary's output, beside "still 250,000 tokens in context")."""
    events = list(RunDirReader(STORM).events())
    translator = ServeStreamTranslator("/app")
    shown: list[str] = []
    for ev in events:
        if ev.type == "opencode":
            for out in translator.feed((json.dumps(ev.payload) + "\n").encode()):
                if isinstance(out, TerminalOutput):
                    shown.append(out.data)
    text = "".join(shown)
    assert "→ 68 tokens" not in text
    after = [line for line in text.splitlines() if "context after the compaction" in line]
    warned = [e.data["tokens_in"] for e in events if isinstance(e, HealthWarning) and "tokens_in" in e.data]
    assert len(after) == 4 and len(warned) >= 2
    for tokens in warned:
        assert any(f"{tokens:,} tokens" in line for line in after), (tokens, after)


# ---- 7: retry, in a run that was not retried -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_retry_outcome_says_what_happened_and_what_a_batch_would_do(tmp_path, wait) -> None:
    """A real model-flaky-500 episode in the live TUI (one attempt): its outcome is the policy's
    `retry`; the header and the failure row say it was not retried here and that a batch would retry
    (the header said `retry (model_server_error)`)."""
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    episode = Episode(load_task(SAMPLES / "model-flaky-500"), config, runs_dir=tmp_path / "runs")
    app = OpenCodeTUI(control=episode, run_episode=episode.run)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.screen
        await wait(pilot, lambda: app.episode_done, timeout=180, what="the episode to end")
        await wait(pilot, lambda: screen.state.outcome is not None, timeout=10, what="the outcome")
        assert screen.state.outcome.action == "retry"
        # (The header is redrawn at its own pace: the last events may still be on their way to it.)
        await wait(
            pilot, lambda: "done ·" in screen.query_one(RunHeader).plain, timeout=10, what="the header's end"
        )
        header = screen.query_one(RunHeader).plain
        assert "retry (" not in header, header
        assert "done · not retried (model_server_error; a batch would retry)" in header, header
        table = screen.query_one(FailuresTable)
        actions = [str(table.get_row_at(i)[3]) for i in range(table.row_count)]
        assert "retry" not in actions and "not retried (a batch would)" in actions, actions
    from opencode_tui.run_command import result_lines

    lines = result_lines(episode._result)
    assert any("`opencode-tui run --batch` would retry it" in line for line in lines), lines


# ---- 9: the command palette offers what applies ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.bwrap
async def test_the_palette_offers_only_what_the_keys_do(tmp_path, wait) -> None:
    """A real hello-file episode: while it runs the palette offers the shell, cancel and keep (as the
    footer does); once the sandbox is released it offers none of them (it offered "Open shell", which
    opened a blank error screen, while `s` did nothing)."""
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    episode = Episode(load_task(SAMPLES / "hello-file"), config, runs_dir=tmp_path / "runs")
    app = OpenCodeTUI(control=episode, run_episode=episode.run)

    def offered() -> set[str]:
        return {c.title for c in app.get_system_commands(app.screen)}

    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.screen
        await wait(pilot, lambda: screen.state.sandbox is not None, timeout=120, what="the sandbox")
        assert {"Open shell", "Cancel episode", "Keep sandbox"} <= offered()
        await wait(pilot, lambda: app.episode_done, timeout=180, what="the episode to end")
        await pilot.pause()
        footer = {b.binding.action for b in screen.active_bindings.values()}
        assert not {"open_shell", "cancel_episode", "toggle_keep"} & footer
        assert not {"Open shell", "Cancel episode", "Keep sandbox"} & offered()
        await pilot.press("s")
        await pilot.pause()
        assert app.screen is screen  # the key does nothing, and nothing offers it


# ---- 11: Enter on a health warning ---------------------------------------------------------------


async def test_enter_on_a_health_warning_opens_its_detail_and_its_call(replay_loaded, wait) -> None:
    """The compaction-storm run's Failures panel: Enter on a health row opens its detail (it showed a
    toast), which names the model call; Enter on that opens the call."""
    events = list(RunDirReader(STORM).events())
    warning = next(e for e in events if isinstance(e, HealthWarning) and "call_id" in e.data)
    app = OpenCodeTUI(run_dir=STORM)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(FailuresTable)
        table.focus()
        row = next(i for i, r in enumerate(table.records) if r == warning)
        table.move_cursor(row=row)
        await pilot.press("enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, WarningDetailScreen)
        assert not app._notifications
        assert detail.call_ids == [warning.data["call_id"]]
        assert warning.message in str(detail.render_detail())
        await pilot.press("enter")  # the call's button has the focus
        await wait(pilot, lambda: isinstance(app.screen, ModelCallScreen), what="the model call")
        assert app.screen.call.call_id == warning.data["call_id"]
        assert isinstance(app.screen.call, ModelCall)


# ---- 12: re-run from the browser and back ---------------------------------------------------------


async def test_the_browser_after_a_rerun_marks_it_against_the_original(fixture_runs, tmp_path) -> None:
    """Back from a re-run: both runs are marked (the original first: `d` compares them), the cursor is
    on the new one and the title says which re-ran which."""
    import shutil

    runs = tmp_path / "runs"
    original = runs / "hello-file-20261201-010000-aaaaaa-a1"
    again = runs / "hello-file-20261201-020000-bbbbbb-a1"
    shutil.copytree(fixture_runs / "hello-file", original)
    shutil.copytree(fixture_runs / "hello-file", again)
    app = OpenCodeTUI(runs_dir=runs, rerun_of=(original, again), notice="Re-run: scored: reward 1")
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        lst = screen.query_one(RunsList)
        assert [p.name for p in lst.marked] == [original.name, again.name]
        assert lst.get_row_at(lst.cursor_row)[0] == again.name
        title = str(screen.query_one("#runs-title").render())
        assert "marked: ● re-run, ● original (d diffs)" in title, title
        assert any("Re-run: scored" in str(n.message) for n in app._notifications)
        await pilot.press("d")
        await pilot.pause()
        assert type(app.screen).__name__ == "DiffScreen"
        assert (app.screen.run_a, app.screen.run_b) == (original, again)


@pytest.mark.slow
@pytest.mark.bwrap
def test_rerun_from_the_browser_returns_to_it(tmp_path: Path) -> None:
    """`opencode-tui runs`, `r` on a real run: the re-run plays live; Esc once it has ended leads back
    to the browser (Esc did nothing) with the two runs marked; `q` there quits (from the run, `q` had
    quit the program)."""
    runs = tmp_path / "runs"
    first = cli("run", "hello-file", "--batch", "--provider", "local", "--runs-dir", str(runs), timeout=300)
    assert first.returncode == 0, first.stderr
    original = Path(json.loads(first.stdout.splitlines()[-1])["run_dir"])
    t = Pty("runs", "--runs-dir", str(runs), cwd=tmp_path)
    try:
        t.wait_for(lambda s: "started (UTC)" in s and "hello-file" in s, 60, "the runs browser")
        t.child.send("r")
        t.wait_for(lambda s: "LIVE" in s, 120, "the live re-run")
        t.wait_for(lambda s: "scored" in s and "LIVE" in s, 180, "the re-run's outcome")
        t.child.send("\x1b")
        t.wait_for(lambda s: "● re-run, ● original" in s and "started (UTC)" in s, 60, "the browser again")
        assert (
            original.name[-9:] in t.text()
        )  # the name's end (hash and attempt): a narrow column cuts its start
        assert len(list(runs.glob("hello-file-*"))) == 2
        t.child.send("q")
        code = t.exit_code(timeout=60)
    finally:
        t.close()
    assert code == 0


# ---- 15: the smaller ones -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.bwrap
async def test_stopping_the_agent_is_cleared_once_the_cancel_is_done(tmp_path, wait) -> None:
    """A real busy episode cancelled with `c` `y`: the warnings line says the agent is being stopped,
    and no longer once it has stopped (it stayed after the outcome)."""
    import shutil

    import yaml

    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "echo busy; sleep 60"}}]},
        {"text": "x"},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    episode = Episode(load_task(task), config, runs_dir=tmp_path / "runs")
    app = OpenCodeTUI(control=episode, run_episode=episode.run)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.screen
        bar = screen.query_one(WarningsBar)
        term = screen.terminal
        await wait(
            pilot,
            lambda: any("sleep 60" in line for line in term._plain(0, term.line_count)),
            120,
            "the command",
        )
        await pilot.press("c")
        await pilot.press("y")
        await wait(pilot, lambda: app.episode_done, timeout=120, what="the episode to end")
        await pilot.pause(0.2)
        assert screen.state.outcome is not None and screen.state.outcome.failure_kind == "run_cancelled"
        assert any(w.code == "cancel_requested" for w in screen.state.warnings)
        shown = _bar_text(bar)
        assert "stopping the agent" not in shown, shown
        # the same events as recorded, folded up to the cancel and up to the receipt after it: the line
        # said "stopping the agent" in between (however short the stop took here)
        events = list(RunDirReader(episode.run_dir.path).events())
        cancel = next(
            i for i, e in enumerate(events) if isinstance(e, Warning_) and e.code == "cancel_requested"
        )
        receipt = next(
            i for i, e in enumerate(events) if i > cancel and getattr(e, "step", None) == "receipt"
        )
        bar.show_state(RunState.fold(events[: cancel + 1]))
        await pilot.pause()
        assert "stopping the agent" in _bar_text(bar)
        bar.show_state(RunState.fold(events[: receipt + 1]))
        await pilot.pause()
        assert "stopping the agent" not in _bar_text(bar)


def _bar_text(bar: WarningsBar) -> str:
    return "".join(s.text for s in bar.render_lines(bar.region.reset_offset)) if bar.display else ""


def test_stopping_warnings_are_the_engines_codes() -> None:
    """The codes the TUI clears are the ones the engine emits while stopping the agent."""
    from opencode_tui_core.events import STOPPING_WARNINGS

    source = (Path(__file__).resolve().parents[2] / "core" / "episode" / "episode.py").read_text()
    for code in STOPPING_WARNINGS:
        assert f'code="{code}"' in source, code
    assert Warning_(code="cancel_requested", message="x").code in STOPPING_WARNINGS


async def test_header_keeps_the_task_name_at_80_columns(replay_loaded) -> None:
    """At 80 columns the header cut the task name (the replay's run directory name came first)."""
    app = OpenCodeTUI(run_dir=STORM)
    async with app.run_test(size=(80, 24)) as pilot:
        await replay_loaded(pilot)
        shown = app.screen.query_one(RunHeader).render().plain
        assert len(shown) <= 80 and "compaction-storm ·" in shown, shown
        assert shown.startswith("done · scored · reward 1 · compaction-storm"), shown


def test_runs_dir_check_names_what_is_in_the_way(tmp_path: Path) -> None:
    from opencode_tui_core.admission import AdmissionError, check_runs_dir

    (tmp_path / "file").write_text("")
    check_runs_dir(tmp_path / "new" / "runs")  # not there yet: it will be made
    with pytest.raises(AdmissionError, match="is not a directory"):
        check_runs_dir(tmp_path / "file")
    with pytest.raises(AdmissionError, match=f"cannot be created: {tmp_path / 'file'} is not a directory"):
        check_runs_dir(tmp_path / "file" / "runs")
    RunDir.create(tmp_path / "ok", "r")
    check_runs_dir(tmp_path / "ok")
