"""The one tally (core/tally.py): what the batch line, run.json, the TUI's stats and the diff count."""

from __future__ import annotations

from opencode_tui_core.events import Compaction, ToolCall, TranscriptStats
from opencode_tui_core.tally import Tally


def test_a_tool_call_counts_once_from_its_first_event_until_the_transcript_says():
    tally = Tally()
    for event in (
        ToolCall(call_id="a", tool="bash", status="running", input={"command": "sleep 9"}),
        ToolCall(call_id="b", tool="read", status="completed"),
        ToolCall(call_id="b", tool="read", status="completed"),  # a repeat is the same call
        ToolCall(call_id="c", tool="bash", status="error"),
        ToolCall(call_id="c", tool="bash", status="error"),
    ):
        tally.count(event)
    # The call still running (a run killed mid-call) counts: the agent made it.
    assert (tally.tool_calls, tally.tool_call_count, tally.tool_errors) == ({"bash": 2, "read": 1}, 3, 1)
    assert tally.last_command == "sleep 9"
    tally.count(TranscriptStats(messages=3, tool_calls={"read": 1}, compactions=0))
    assert (tally.tool_calls, tally.tool_call_count, tally.compactions) == ({"read": 1}, 1, 0)


def test_compactions_are_the_highest_count_seen_until_the_transcript_says():
    tally = Tally()
    assert tally.compactions == 0
    for count in (1, 3, 2):
        tally.count(Compaction(count=count))
    assert tally.compactions == 3
    tally.count(TranscriptStats(messages=1, tool_calls={}, compactions=4))
    assert tally.compactions == 4
