"""What the TUI says about unknowns and about who did what: a reward that is unknown, an informational
notice that is not a warning, the keys the footer shows named the same in the help, the verifier's
stderr in sight, and what ended a shell. Pilot over the recorded runs, real events folded."""

from __future__ import annotations

from datetime import UTC, datetime

from textual.app import App, ComposeResult
from textual.widgets import TextArea

from opencode_tui import format as fmt
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.help import MORE_KEYS, bindings_markdown
from opencode_tui.screens.inspect import InspectScreen
from opencode_tui.screens.shell import run_ended_it
from opencode_tui.state import RunState
from opencode_tui.widgets.progress import WarningsBar
from opencode_tui_core.events import (
    FailureRecorded,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    VerificationFinished,
    Warning_,
)
from opencode_tui_core.failures import FailureEvent, FailureStage, decide

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_an_unknown_reward_is_a_dash_not_none() -> None:
    unknown = OutcomeDecided(ts=NOW, action="mark_evaluation_error", reward=None, summary="e")
    assert fmt.summarize(unknown) == "outcome mark_evaluation_error reward –"
    assert fmt.summarize(OutcomeDecided(ts=NOW, action="scored", reward=1.0, summary="ok")).endswith(
        "reward 1"
    )
    unsure = VerificationFinished(ts=NOW, exit_code=None, reward=None, passed=None, duration_s=0.5)
    assert "None" not in fmt.summarize(unsure) and "reward –" in fmt.summarize(unsure)


class _Bar(App[None]):
    def compose(self) -> ComposeResult:
        yield WarningsBar(id="bar")


async def test_ripgrep_provisioned_is_an_info_line_not_a_warning() -> None:
    rg = Warning_(ts=NOW, code="ripgrep_provisioned", message="no rg in the image; provisioned /tmp/x/bin/rg")
    app = _Bar()
    async with app.run_test(size=(120, 5)) as pilot:
        bar = app.query_one(WarningsBar)
        bar.show_state(RunState.fold([rg]))
        await pilot.pause()
        shown = bar.render_line(0).text + "".join(bar.render_line(y).text for y in range(1, bar.size.height))
        assert bar.display and "ℹ ripgrep_provisioned" in shown and "⚠" not in shown
        other = Warning_(ts=NOW, code="disk_limit_unenforced", message="no disk limit here")
        bar.show_state(RunState.fold([rg, other]))
        await pilot.pause()
        shown = "".join(bar.render_line(y).text for y in range(bar.size.height))
        assert "⚠ disk_limit_unenforced" in shown and "(+" not in shown  # the notice is no warning


async def test_help_names_the_keys_the_footer_shows(fixture_runs, replay_loaded) -> None:
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        table = bindings_markdown(app.screen)
        footer = {b.binding.key_display for b in app.screen.active_bindings.values() if b.binding.show}
        assert {"[", "]"} <= footer
        assert "| `[` |" in table and "| `]` |" in table
        # the hidden panel jumps are explained apart from the footer's one-event steps
        assert "`[` / `]` step one event" in MORE_KEYS and "`{` / `}`" in MORE_KEYS


async def test_verifier_stderr_sits_right_under_stdout(fixture_runs, replay_loaded, wait) -> None:
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        await pilot.press("v")
        await wait(pilot, lambda: isinstance(app.screen, InspectScreen) and app.screen.loaded, what="files")
        await pilot.press("right")
        await pilot.pause()
        out = app.screen.query_one("#verify-stdout", TextArea)
        err = app.screen.query_one("#verify-stderr", TextArea)
        lines = out.document.line_count
        # stdout is as tall as its text (a few lines here), stderr's caption right after it
        assert out.region.height <= lines + 1, (out.region, lines)
        assert err.region.y - out.region.bottom <= 2, (out.region, err.region)


def _failure(kind: str, message: str) -> FailureRecorded:
    failure = FailureEvent(kind=kind, stage=FailureStage.AGENT, operation="run", message=message)
    return FailureRecorded(ts=NOW, failure=failure, decision=decide(failure))


def test_what_ended_a_shell() -> None:
    agent = PhaseChanged(ts=NOW, phase=Phase.AGENT)
    closing = PhaseChanged(ts=NOW, phase=Phase.CLOSING)
    assert run_ended_it(RunState.fold([agent])) is None  # the person exited it
    timeout = _failure("agent_timeout", "the run deadline of 25s fired")
    assert run_ended_it(RunState.fold([agent, timeout, closing])) == (
        "the run ended it (agent_timeout: the run deadline of 25s fired)"
    )
    assert "moved on to closing" in (run_ended_it(RunState.fold([agent, closing])) or "")
