"""Stats: compactions, tool calls by tool, model calls and tokens, verification and outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from textual.content import Content

from opencode_tui import format as fmt
from opencode_tui.state import RunState
from opencode_tui.widgets.base import Panel, ShowsRunState
from opencode_tui_core.failures import Outcome


def _by_tool(counts: dict[str, int]) -> str:
    return " · ".join(f"{tool} {n}" for tool, n in counts.items()) or "none"


def verification_words(state: RunState) -> tuple[str, str, str]:
    """The Verification line: its verdict, style and a dim note (exit code, duration).

    It never contradicts the outcome: the verifier's reward is the run's reward only when the outcome is
    ``scored``; otherwise the line says the verifier's result is not the reward (e.g. a ``timeout`` whose
    verifier passed is counted as zero)."""
    v = state.verification
    if v is None:
        return ("not run" if state.finished else "not yet"), "$state-pending", ""
    o = state.outcome
    note = f" · exit {fmt.DASH if v.exit_code is None else v.exit_code} · {fmt.seconds(v.duration_s, 1)}"
    if v.passed is None:
        return "inconclusive", "$state-skipped", note
    verdict = "passed" if v.passed else "failed"
    style = "$state-ok" if v.passed else "$state-failed"
    if o is not None and o.action is not Outcome.SCORED:
        why = "the attempt failed" if o.action is Outcome.RETRY else str(o.action)  # retry: see Outcome
        return f"{verdict} (not the reward: {why})", style, note
    reward = fmt.DASH if v.reward is None else f"{v.reward:g}"
    return f"{verdict} · reward {reward}", style, note


def _by_person(answered: int, edited: int) -> str:
    parts = [f"{answered} answered by a person"] if answered else []
    if edited:
        parts.append(f"{edited} reply edited by a person" if edited == 1 else f"{edited} replies edited")
    return " · ".join(parts)


def _counted(row: Callable[..., None], label: str, counts: Counter[str]) -> None:
    """A total, then each kind's count: ``Model calls  3  title 1 · agent 2``."""
    row(
        label,
        "$n  $kinds",
        n=str(sum(counts.values())),
        kinds=" · ".join(f"{k} {v}" for k, v in counts.items()),
    )


class StatsPanel(ShowsRunState, Panel):
    """Live counts from events; the transcript's counts (the source of truth) once cleanup confirmed."""

    def show_state(self, state: RunState) -> None:
        rows: list[Content] = []

        def row(label: str, markup: str, **values: object) -> None:
            rows.append(Content.from_markup(f"[b]{label:<13}[/]" + markup, **values))

        last = state.compactions[-1].trigger if state.compactions else None
        row("Compactions", "$n$last", n=str(state.compaction_count), last=f" (last: {last})" if last else "")
        tools = state.tool_counts
        row("Tool calls", "$n  $by", n=str(sum(tools.values())), by=_by_tool(tools))
        if state.tool_errors:
            row("", "[$state-failed]$n failed[/]", n=str(state.tool_errors))
        _counted(row, "Model calls", Counter(c.kind for c in state.model_calls))
        failed_calls = sum(1 for c in state.model_calls if c.failed and (c.status is not None or c.error))
        if failed_calls:
            row("", "[$state-failed]$n failed[/]", n=str(failed_calls))
        # a person's replies are not the model's: said where the calls are counted
        answered = sum(1 for c in state.model_calls if c.answered_by)
        edited = sum(1 for c in state.model_calls if c.edited_by)
        if answered or edited:
            row("", "[b $warning]$words[/]", words=_by_person(answered, edited))
        if state.interventions:
            _counted(row, "Debugger", Counter(i.what for i in state.interventions))
        # One definition everywhere (opencode_tui_core.tokens): every model call, title and compaction included.
        row(
            "Tokens",
            "in $tin · out $tout (all calls)",
            tin=fmt.count(state.tokens("tokens_in")),
            tout=fmt.count(state.tokens("tokens_out")),
        )
        row(
            "",
            "cache read $tc · reasoning $tr",
            tc=fmt.count(state.tokens("tokens_cache_read")),
            tr=fmt.count(state.tokens("tokens_reasoning")),
        )
        t = state.transcript
        if t is None:
            row("Transcript", "[dim]after confirmed cleanup[/]")
        else:
            row(
                "Transcript",
                "$msgs messages · $comp compactions$trig$subs",
                msgs=str(t.messages),
                comp=str(t.compactions),
                trig=f" ({', '.join(t.compaction_triggers)})" if t.compaction_triggers else "",
                # Subagent sessions have their own transcripts (trajectory.json); the counts here are the root's.
                subs=f" · {t.subagent_sessions} subagent session(s)" if t.subagent_sessions else "",
            )
            row("", "tools $by", by=_by_tool(dict(sorted(t.tool_calls.items(), key=lambda kv: -kv[1]))))
            row(
                "",
                "agent tokens in $tin · out $tout",
                tin=fmt.count(t.tokens_in),
                tout=fmt.count(t.tokens_out),
            )
        verdict, style, note = verification_words(state)
        row("Verification", f"[{style}]$verdict[/][dim]$note[/]", verdict=verdict, note=note)
        o = state.outcome
        if o is not None:
            style = "$state-ok" if o.action is Outcome.SCORED else "$state-failed"
            row(
                "Outcome",
                f"[b {style}]$action[/] · reward $reward · $summary",
                action=fmt.action_words(o.action, bool(state.info and state.info.batch_id)),
                reward=fmt.DASH if o.reward is None else f"{o.reward:g}",
                # the engine's summary ends with the action, said first here (and in the TUI's words)
                summary=fmt.short(o.summary.removesuffix(f" → {o.action}"), 120),
            )
        self.show_content(Content("\n").join(rows))
