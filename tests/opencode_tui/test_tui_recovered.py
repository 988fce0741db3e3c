"""The failures panel shows a failure the provider recovered from as a "recovered" row.

The recorded runs (``tests/fixtures/runs``, Docker provider) have no recovered failure, so a copy of
the recorded ``hello-file`` run gets one ``FailureRecovered`` event (typed, through the real encoder)
inserted before its outcome: the kind the OpenSandbox provider emits when a command's output stream
broke and its exit was read by execution id. The run's own outcome (scored) is left as recorded; the
recovered row never has a class or an action. Live and replay fold the same events
(``RunState.apply``), so the replay path covers both.
"""

from __future__ import annotations

import shutil

from opencode_tui import format as fmt
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.modals import FailureScreen
from opencode_tui.state import RunState
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.events import FailureRecovered, OutcomeDecided, encode
from opencode_tui_core.failures import CommandDetails, Delivery, FailureEvent, FailureStage
from opencode_tui_core.sandbox.base import Recovery

SIZE = (160, 45)


def _with_recovered(fixture_runs, tmp_path):
    run = tmp_path / "recovered"
    shutil.copytree(fixture_runs / "hello-file", run)
    events = list(RunDirReader(run).events())
    at = next(i for i, e in enumerate(events) if isinstance(e, OutcomeDecided))
    recovered = FailureRecovered(
        seq=events[at].seq,
        ts=events[at - 1].ts,
        failure=FailureEvent(
            kind="command_stream_lost",
            stage=FailureStage.VERIFICATION,
            operation="exec.stream",
            message="exec ex-1 (execd 7a7c): the command's event stream broke; following the execution id",
            details=CommandDetails(execution_id="7a7c", delivery=Delivery.DELIVERED, submissions=1),
        ),
        recovery=Recovery.FOLLOWED_EXECUTION_ID,
    )
    renumbered = [
        *events[:at],
        recovered,
        *(e.model_copy(update={"seq": e.seq + 1}) for e in events[at:]),
    ]
    (run / RunFiles.EVENTS).write_text("".join(encode(e) + "\n" for e in renumbered))
    return run, recovered


async def test_a_recovered_failure_is_a_recovered_row_with_no_class_or_action(
    fixture_runs, tmp_path, replay_loaded
):
    run, recovered = _with_recovered(fixture_runs, tmp_path)
    state = RunState.fold(RunDirReader(run).events())
    assert state.failures == [recovered]
    assert state.outcome is not None and state.outcome.action == "scored"  # the outcome is untouched

    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(FailuresTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert rows == [
            ["command_stream_lost", "verification", "—", "recovered: followed by execution id", "none"]
        ]
        assert table.border_subtitle == "1"
        assert fmt.summarize(recovered) == (
            "recovered command_stream_lost @verification (followed by execution id)"
        )
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FailureScreen)
        detail = app.screen.render_detail().plain
        assert "recovered       followed by execution id" in detail
        assert "following the execution id" in detail and '"execution_id": "7a7c"' in detail
        assert "decided by" not in detail and "action" not in detail.split("Message")[0]
