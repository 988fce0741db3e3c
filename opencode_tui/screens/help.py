"""Help: every key binding of the current screen and what each panel means."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Markdown

PANELS = """\
## Panels

- **Header** (one line, cut with … on a narrow terminal): first the phase and its state, or once decided
  the outcome with its failure kind and reward (its colour says scored or not), then the elapsed time
  against the run budget, LIVE or REPLAY, whether the sandbox is kept, task, provider, OpenCode version,
  model and the sandbox id (*owned*: created and destroyed by us; *borrowed*: attached by id and never
  destroyed).
- **Small terminals** (under 100×30): one panel at a time, named on the tab line; `1`–`5` (or a click)
  switch between Terminal, Stats, Cleanup, Model calls and Failures.
- **Terminal**: what a person would have seen: the agent's terminal output with its colours, each bash
  tool call as `$ command` followed by its output, file edits as a short diff, the assistant's text.
  `l` follows new output or pauses (scrolling up pauses too); `r` shows the harness's raw stdout/stderr
  byte for byte, escape sequences visible (once a live run has ended, `r` re-runs it instead, in a
  sandbox prepared ahead while you read; the palette's *Raw output* still switches the view). Select text with the mouse and press `y` to copy it.
  `/` (or `ctrl+f` anywhere) searches the shown view, case-insensitive: every match highlighted, `n` / `N`
  go to the next / previous one, `escape` clears the search. Enter opens the latest tool call on screen
  in full (the **step view**: its command or arguments, whole output, exit status, duration, and the
  model call that asked for it: `m` opens that call).
- **Stats**: compactions (and what triggered the last one), tool calls by tool, model calls by kind,
  tokens (a dash means *unknown*, never zero). The transcript line appears once cleanup is confirmed:
  its counts come from OpenCode's own database and are the source of truth.
- **Cleanup**: the four steps the engine must confirm before exporting or verifying anything: the
  supervisor's cleanup receipt, descendants drained, transcript snapshot, sandbox released. Each is
  pending ○, running ◐, ok ✓, failed ✗ or skipped -, with the engine's reason. Enter on the panel (or
  `v`) shows each step's detail: the receipt's fields (cleanup confirmed, descendants killed, the agent's
  exit code or signal, the run deadline), what became of the sandbox (destroyed, disconnected, kept).
- **Inspect** (`v`): the cleanup detail, the verifier's stdout and stderr, and what OpenCode was given
  exactly as sent: the rendered prompt, the instructions file, the task's task.yaml.
- **Model calls**: every call seen by the recording proxy: time since start, kind (title, agent,
  compaction), HTTP status, latency and time to first token, tokens, the assistant message it belongs
  to. Enter shows the call: the request as a conversation (system prompt and tools folded, each message
  with its role), the response assembled from the stream (text, reasoning, tool calls with their
  arguments parsed); `r` switches to the raw recorded bodies, `end` / `home` go to the end / start. `/` filters:
  `status:error` (no response or HTTP ≥ 400), `status:ok`, `status:4xx`, `status:429|5xx`, `kind:agent`, `kind:title|compaction`, or words
  (call id, message id, session id, error text); `escape` in the filter shows all calls again. A
  subagent's calls (made in the `task` tool's child session, not the episode's own) are marked `↳`
  before their kind; the word `subagent` filters them.
- **Failures**: each failure event with its stage, its class (*model*, *evaluation* or *unknown*) and
  the outcome policy's action. Enter shows the message, the cause chain and the evidence (source, scope,
  when it was observed, what it said); a failure of a model call names it, and Enter there opens it.
  Episode-health warnings are listed here too (class *health*, action *warning*): signs the run is
  going badly (a compaction storm, reads without edits, a silent command, a repeated tool call, a
  429/5xx storm), never the outcome; the latest is on the warnings line under the header.
- **Stats › Verification**: *not run*, *inconclusive*, or *passed/failed · reward N*; when the outcome is
  not *scored* the verifier's result is not the run's reward and the line says so.
- **Debugger** (live, issue 27): a held model call leads the header (`HELD before call N (12 s, run
  deadline counting)`) and the line under it lists what to do: `g` continue, `n` step, `h` the held
  request, `m` say, `a` answer by hand, `e` edit the model's reply, `x` abort the turn; `b` holds the
  next call. The answer/edit box takes plain text or `{"tool": NAME, "arguments": {...}}`; `ctrl+s` sends.
- **Timeline** (replay): the position in the event stream, with markers: `m` model call, `o` tool call,
  `a` a subagent's model call, `$` shell, `C` compaction, `!` health warning, `I` debugger intervention, `✗`
  failure. With the timeline focused the same letters jump to the next one (shift: the previous; `h` for
  shells, `w` for health warnings, `i` for interventions, `x` for failures); Enter opens the event at the
  cursor: a tool call's step view, a model call, a shell's recording. The panels show the run as it was at
  that event. `p` plays from there: the terminal recording and then the rest of the run (cleanup,
  verification, outcome); at the end `p` plays again from the start.
- **Shells** (replay, `S` or Enter on a `$`): a person's shell in the sandbox played from
  `shells/shell-N.cast`: what it showed, and beside it every line typed with its time (for a run
  marked *human intervened* that is the question). `p` plays from where it is, `f` fast, `home` the
  start, `end` the whole session, `escape` back to the run.

## Runs browser and diff

`opencode-tui runs`: `s` sorts by date, task, outcome, failure kind, provider (`S` reverses), `/` filters
(`outcome:X kind:X task:X provider:X date:X`, `date>=X`/`date<X` or words), `space` marks, `d` compares the two marked runs,
`D` compares the selected run with the previous attempt of its task, `r` runs the selected run's task
again with its recorded configuration. Columns beyond the outcome: health warnings (`⚠N`), the batch id,
whether the sandbox was kept; at 80 columns the start and the reward stay. `opencode-tui diff A B`: drift
(version, task, config) first, then both runs' steps side by side (`▶` the first divergence, `≠` other
differences, `f` jumps back to it), the highlighted step with both tool outputs side by side (Enter:
both in full), and the deltas.

## Live and replay

A live run streams events from the engine; `opencode-tui open RUN_DIR` replays a run directory through
the same widgets. Quitting a live run asks first, cancels the episode and waits until the engine has
confirmed cleanup. The shell (`s`) needs a live sandbox; in a replay it is unavailable.
"""


MORE_KEYS = """\
More keys: `tab` / `shift+tab` move the focus between panels · `enter` opens the selected model call or
failure · in a replay `[` / `]` step one event back/forward (as in the footer), `shift+[` / `shift+]`
(`{` / `}`) jump to the previous/next event that changed a panel, `N` to the previous failure, and with
the timeline focused `←` / `→` (`shift` for 100), `home` / `end` · `escape` stops a
playback or returns to the runs browser · in the shell every key goes to the shell, `ctrl+]` comes back ·
`ctrl+p` opens the command palette.
"""


def bindings_markdown(screen: Screen) -> str:
    """The keys shown in the footer of ``screen`` (with the focused widget's), with their descriptions."""
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for active in screen.active_bindings.values():
        binding: Binding = active.binding
        if not active.enabled or not binding.show or not binding.description:
            continue
        display = binding.key_display or screen.app.get_key_display(binding)
        if display in seen:
            continue
        seen.add(display)
        rows.append((display, binding.tooltip or binding.description))
    table = ["| key | what it does |", "|---|---|"]
    table += [f"| `{k}` | {d} |" for k, d in rows]
    return "## Keys on this screen\n\n" + "\n".join(table) + "\n\n" + MORE_KEYS


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f1,question_mark", "dismiss", "Close", id="help.close")]

    def __init__(self, for_screen: Screen) -> None:
        super().__init__(classes="modal")
        self.text = "# opencode-tui\n\n" + bindings_markdown(for_screen) + "\n" + PANELS

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog help") as dialog:
            dialog.border_title = "Help"
            dialog.border_subtitle = "esc close"
            with VerticalScroll():
                yield Markdown(self.text, id="help-text")
