"""Run directory: permissions, redaction on disk, diagnostics cap, reader round-trip."""

import json
import stat

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opencode_tui_core.artifacts import RunDir, RunDirReader, RunFiles, RunInfo, list_runs
from opencode_tui_core.diagnostics import DIAGNOSTICS_CAP, cap_diagnostics
from opencode_tui_core.events import TerminalOutput
from opencode_tui_core.redaction import REDACTED, redact, redact_text

KEY = "sk-proj-abcdefghijklmnopqrstuvwx"


def test_run_dir_is_private_and_redacts_everything(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "r1", secrets=("hunter2-literal",))
    assert stat.S_IMODE(rd.path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == 0o700
    rd.append_event(TerminalOutput(stream="stdout", data=f"export OPENAI_API_KEY={KEY}\n"))
    rd.append_event(TerminalOutput(stream="stdout", data="password is hunter2-literal\n"))
    rd.write_json("cleanup.json", {"headers": {"Authorization": "Bearer abcdefghijklmnop"}, "ok": True})
    rd.write_text("stderr.log", f"curl -H 'Authorization: Bearer {KEY}'\n")
    rd.cast().output(f"echo {KEY}\r\n")
    rd.write_run_info(RunInfo(run_id="r1", task_id="t", provider="local"))
    rd.close()
    assert stat.S_IMODE((rd.path / "cleanup.json").parent.stat().st_mode) == 0o700
    for p in rd.path.rglob("*"):
        if p.is_file():
            text = p.read_text()
            assert KEY not in text, p
            assert "hunter2-literal" not in text, p
            assert "abcdefghijklmnop" not in text, p
    assert json.loads((rd.path / "cleanup.json").read_text())["headers"]["Authorization"] == REDACTED
    reader = RunDirReader(rd.path)
    events = list(reader.events())
    assert len(events) == 2 and REDACTED in events[0].data
    assert reader.info().task_id == "t"
    cast = (rd.path / RunFiles.CAST).read_text().splitlines()
    assert json.loads(cast[0])["version"] == 2
    assert json.loads(cast[1])[1] == "o"
    assert [p for p, _ in list_runs(tmp_path / "runs")] == [rd.path]


def test_reader_refuses_non_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        RunDirReader(tmp_path)


def test_redaction_nested_json_and_free_text():
    data = {
        "model": {"api_key": "plain-value-1234", "nested": [{"Authorization": "Basic dXNlcjpwYXNz"}]},
        "messages": [{"content": f"my key is {KEY}, token=abcd1234efgh and Bearer eyJhbGciOi.x.y"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }
    out = redact(data)
    assert out["model"]["api_key"] == REDACTED
    assert out["model"]["nested"][0]["Authorization"] == REDACTED
    content = out["messages"][0]["content"]
    assert KEY not in content and "abcd1234efgh" not in content and "eyJhbGciOi" not in content
    assert out["usage"] == {"prompt_tokens": 12, "completion_tokens": 3}  # token counts are not secrets
    assert redact_text("Authorization: Bearer xyz12345678\nnext") == f"Authorization: {REDACTED}\nnext"
    assert redact_text("nothing secret here: tokens_in=5") == "nothing secret here: tokens_in=5"


# Texts for the check that skipping a pattern whose words a text lacks changes nothing: every pattern,
# upper case, a replacement next to another secret, and the letters ``re`` folds onto ASCII ones
# (dotless i, I with a dot, long s, the Kelvin sign) that ``str.lower`` alone would miss.
REDACTION_TEXTS = [
    "nothing secret here: tokens_in=5",
    "AUTHORIZATION: whatever it is\nnext line",
    "  proxy-authorization :  Basic dXNlcjpwYXNz",
    "curl -H 'X: BEARER abcdefgh12345678'",
    f"keys: {KEY} and ghp_abcdefghijklmnop1234 and xoxb-123456789012-abc",
    "github_pat_11ABCDEFG0123456789_abcdefghij and nvapi-abcdefghijklmnop",
    '{"Api-Key": "abcd1234", "PASSWORD"= hunter22, "auth_token":"zzzz9999"}',
    "\u017fecret=abcdefgh",  # long s
    "author\u0130zation: abcdefgh",  # I with a dot
    "author\u0131zation: abcdefgh",  # dotless i
    "api_\u212aey=abcdefgh",  # Kelvin sign
    "caf\u00e9 token: abcdefgh, na\u00efve",
    "sk-short tok=ab",
]


@pytest.mark.parametrize("text", REDACTION_TEXTS)
def test_redact_text_skips_only_patterns_that_cannot_match(text):
    from opencode_tui_core.redaction import _TEXT_PATTERNS

    every = text
    for _, pattern, repl in _TEXT_PATTERNS:
        every = pattern.sub(repl, every)
    assert redact_text(text) == every


def test_basic_credentials_are_redacted_and_a_word_after_basic_in_prose_is_not():
    """Basic credentials are ``user:password`` in base64 (RFC 7617); OpenCode's own tool descriptions
    say "for basic searches", which was recorded as "for basic [REDACTED]"."""
    assert (
        redact_text("curl -H 'Authorization: Basic dXNlcjpwYXNz' x")
        == f"curl -H 'Authorization: Basic {REDACTED}' x"
    )
    assert redact_text("basic YTpi") == f"basic {REDACTED}"  # a:b
    prose = '"quick" for basic searches, "medium" for moderate exploration'
    assert redact_text(prose) == prose
    assert redact_text("basic abcdefgh") == "basic abcdefgh"  # base64, but no user:password


def test_a_long_text_redacted_again_is_redacted_alike_and_per_literal_secret():
    """Long texts' redactions are remembered (a model call repeats its prompt): the second time gives
    what the first gave, and a literal secret given the second time is still scrubbed."""
    text = "You are a helpful agent. " * 60 + f"token={KEY} and the word hunter2-literal"
    first = redact_text(text)
    assert KEY not in first and "hunter2-literal" in first
    assert redact_text(text) == first
    with_literal = redact_text(text, ("hunter2-literal",))
    assert "hunter2-literal" not in with_literal and KEY not in with_literal
    assert redact_text(text) == first


def test_a_long_text_is_remembered_only_once_it_comes_again():
    """A long text seen once (an episode's trajectory, a model's answer) is not kept: a long batch's
    memory does not climb by the whole budget. Seen again, it is kept and later lookups hit."""
    from opencode_tui_core.redaction import _REMEMBERED, _Remembered

    once = [f"episode {i}: " + "a unique trajectory line\n" * 80 for i in range(50)]
    held = _REMEMBERED.held_chars
    for text in once:
        redact_text(text)
    assert _REMEMBERED.held_chars == held
    repeated = "You are a helpful agent; the same system prompt in every call. " * 40
    key = _Remembered.key(repeated, ())
    redact_text(repeated)
    assert _REMEMBERED.get(key) is None and _REMEMBERED.held_chars == held
    second = redact_text(repeated)
    assert _REMEMBERED.get(key) == second and _REMEMBERED.held_chars == held + len(second)


# Values for the check that the run directory's skip (``could_change``) never skips a change: every
# text above, keys that name a secret whatever their value, literal secrets plain and escaped.
COULD_CHANGE_VALUES = [
    *({"text": t} for t in REDACTION_TEXTS),
    {"Cookie": "a=1"},
    {"headers": [{"Set-Cookie": "sid=abc"}]},
    {"passwd": "x"},
    {"data": "run hunter2-literal now"},
    {"data": 'quote" and \\ hunter2-"lit'},
    {"data": "caf\u00e9-s\u00e9cret-literal"},
    {"tokens_in": 5, "tokens_out": 7, "data": "nothing here"},
    {"data": "plain output \x1b[1mbold\n", "stream": "stdout"},
]
LITERALS = ("hunter2-literal", 'hunter2-"lit', "caf\u00e9-s\u00e9cret-literal")


@pytest.mark.parametrize("value", COULD_CHANGE_VALUES)
@pytest.mark.parametrize("secrets", [(), LITERALS], ids=["no-literals", "literals"])
def test_a_write_skips_redaction_only_when_it_would_change_nothing(value, secrets):
    from opencode_tui_core.redaction import could_change

    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=2)):
        if not could_change(text, secrets):
            assert redact(json.loads(text), secrets) == json.loads(text), text


# The property below builds texts as a secret is shaped: something before, a name (every word the
# patterns and the secret keys need, in both cases, and near misses), what may follow it (a quote, a
# plural s, every kind of white space JSON writes as itself, as an escape or as \\uXXXX, a separator),
# a value; keys alike.
_BEFORE = ["", "x", "x-", "api_", "api-", "access_", "auth-", "refresh_", "client_", "proxy-", " ", "\n", '"']
_NAMES = [
    "key",
    "KEY",
    "token",
    "Token",
    "tokens",
    "secret",
    "password",
    "passwd",
    "cookie",
    "set-cookie",
    "apikey",
    "authorization",
    "Authorization",
    "author\u0131zation",
    "\u017fecret",
    "api_\u212aey",
    "bearer",
    "Basic",
    "sk-",
    "nvapi-",
    "ghp_",
    "gho_",
    "github_pat_",
    "xoxb-",
    "word",
]
_QUOTES = ["", '"', "\\", "s", "_"]
_SPACES = [" ", "\n", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2003"]
_SEPARATORS = ["", ":", "=", ","]
_SECRET_VALUES = [
    "",
    "abcdefgh",
    "12345678901234",
    "ab",
    " abcdefgh",
    '"abcdefgh"',
    "}",
    "dXNlcjpwYXNz",
    "YTpi==",
]
_SHAPED = st.tuples(
    st.sampled_from(_BEFORE),
    st.sampled_from(_NAMES),
    st.sampled_from(_QUOTES),
    st.lists(st.sampled_from(_SPACES), max_size=2).map("".join),
    st.sampled_from(_SEPARATORS),
    st.sampled_from(_SECRET_VALUES),
).map("".join)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        _SHAPED | st.integers(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_SHAPED, inner, max_size=3),
        max_leaves=4,
    ),
    st.booleans(),
)
@example({"Token\n": "x"}, True)  # (a secret key's pattern ends in ``$``: it allows a final newline)
@example({"d": "for basic searches, or Basic\tdXNlcjpwYXNz"}, False)  # (Basic: only credentials count)
def test_the_skip_never_skips_a_change_whatever_the_text(value, ascii_only):
    """The property behind the skip: whenever ``could_change`` says no, the walk changes nothing,
    over texts shaped like what the patterns and the secret keys look for, and near misses."""
    from opencode_tui_core.redaction import could_change

    text = json.dumps(value, ensure_ascii=ascii_only)
    if not could_change(text):
        assert redact(json.loads(text)) == json.loads(text), text


def test_the_skip_is_taken_for_what_holds_nothing_and_refused_for_a_cookie(tmp_path):
    """The skip exists (most events hold nothing), and a key that names a secret but shares no word
    with the text patterns (a cookie) is still redacted on disk."""
    from opencode_tui_core.redaction import could_change

    rd = RunDir.create(tmp_path / "runs", "r1")
    rd.write_json("headers.json", {"Cookie": "sid=abcdefgh", "ok": True})
    rd.close()
    assert json.loads((rd.path / "headers.json").read_text())["Cookie"] == REDACTED
    assert not could_change(json.dumps({"data": "plain \x1b[1mbold"}), ("hunter2-literal",))


def test_events_with_a_provider_key_alone_are_redacted_on_disk(tmp_path):
    """An event line whose only secret is a GitHub or Slack token (no word like ``token`` beside it)."""
    rd = RunDir.create(tmp_path / "runs", "r1")
    rd.append_event(TerminalOutput(stream="stdout", data="ghp_abcdefghijklmnop1234\n"))
    rd.append_event(TerminalOutput(stream="stdout", data="xoxb-123456789012-abcdefgh\n"))
    rd.close()
    text = (rd.path / RunFiles.EVENTS).read_text()
    assert "ghp_abcdefghijklmnop1234" not in text and "xoxb-123456789012" not in text
    assert text.count(REDACTED) == 2


def test_diagnostics_fit_untouched_when_small():
    out = cap_diagnostics([("stdout", "hello\n"), ("log", "world")])
    assert out == "===== stdout =====\nhello\n===== log =====\nworld\n"


def test_diagnostics_cap_exact_with_head_and_tail():
    big = "HEAD" + "x" * 50_000 + "TAIL"
    out = cap_diagnostics([("output.log", big), ("cleanup", "small part\n")])
    assert len(out) == DIAGNOSTICS_CAP
    assert "small part" in out  # a small part keeps all of it
    assert "===== output.log =====\nHEAD" in out
    assert "TAIL\n===== cleanup" in out
    assert "characters truncated" in out


def test_diagnostics_even_split_between_oversized_parts():
    out = cap_diagnostics([("first", "q" * 40_000), ("second", "z" * 40_000)])
    assert len(out) == DIAGNOSTICS_CAP
    nq, nz = out.count("q"), out.count("z")
    assert abs(nq - nz) <= len("second") - len("first") + 1  # even split; only header lengths differ


def test_diagnostics_stderr_not_duplicated():
    log = "Traceback...\nboom\n" * 10
    out = cap_diagnostics([("output.log", "start\n" + log + "end\n"), ("stderr", log)])
    assert "===== stderr" not in out
    out2 = cap_diagnostics([("output.log", "start\n"), ("stderr", log)])
    assert "===== stderr" in out2


@pytest.mark.parametrize("n", [1, 3, 7])
def test_diagnostics_cap_holds_for_many_parts(n):
    parts = [(f"p{i}", str(i) * (10_000 + i * 977)) for i in range(n)]
    out = cap_diagnostics(parts)
    if sum(len(t) for _, t in parts) > DIAGNOSTICS_CAP:
        assert len(out) == DIAGNOSTICS_CAP
    else:
        assert len(out) < DIAGNOSTICS_CAP and "truncated" not in out
    for i in range(n):
        assert f"===== p{i} =====" in out


@pytest.mark.parametrize("fill", [15_000, 16_000, 60_000])
def test_diagnostics_file_on_disk_stays_under_the_cap_when_redaction_grows_it(tmp_path, fill):
    """Short secrets (a 4-character literal, ``token=abcd``) become the longer marker; the file that
    is written, read back from disk, still holds at most the cap and no secret."""
    rd = RunDir.create(tmp_path / "runs", "r1", secrets=("s3cr",))
    unit = "s3cr token=abcd "
    text = (unit * (fill // len(unit) + 1))[:fill]
    parts = [("failure agent_nonzero_exit", "exit 1 with s3cr\n"), ("opencode/output.log", text)]
    rd.write_diagnostics(parts)
    rd.close()
    on_disk = (rd.path / RunFiles.DIAGNOSTICS).read_text(encoding="utf-8")
    assert len(on_disk) <= DIAGNOSTICS_CAP
    assert "s3cr" not in on_disk and "token=abcd" not in on_disk
    assert REDACTED in on_disk
    if fill >= 16_000:  # grown past the cap by redaction: cut to exactly the cap, marker included
        assert len(on_disk) == DIAGNOSTICS_CAP and "characters truncated" in on_disk


def test_events_writer_fault_is_reported_once_and_never_raises(tmp_path):
    """events.jsonl on a device that refuses every write (/dev/full: ENOSPC, a real full disk as far as
    the writer can tell): appending never raises into the bus, the first fault is reported through
    on_write_error (the episode turns it into artifacts_write_failed), later ones are not repeated,
    and the other consumers of the bus go on receiving every event."""
    from opencode_tui_core.events import EventBus

    run = tmp_path / "r1"
    run.mkdir()
    (run / RunFiles.EVENTS).symlink_to("/dev/full")
    rd = RunDir(run)
    reported: list[str] = []
    rd.on_write_error = reported.append
    bus = EventBus()
    seen: list = []
    bus.subscribe(rd.append_event)
    bus.subscribe(seen.append)
    for i in range(3):
        bus.emit(TerminalOutput(stream="stdout", data=f"line {i}\n"))
    assert len(reported) == 1 and RunFiles.EVENTS in reported[0] and "No space left" in reported[0]
    assert rd.write_error == reported[0]
    assert [e.data for e in seen] == ["line 0\n", "line 1\n", "line 2\n"]  # nobody was dropped
    assert not bus.errors
    rd.write_run_info(RunInfo(run_id="r1", task_id="t", provider="local"))  # other files still written
    assert RunDirReader(run).info().run_id == "r1"
    rd.close()


def test_reader_reads_every_file_through_runfiles(tmp_path):
    """The typed reader: run info, events, failures, model calls by id (a torn last line skipped),
    the verifier's output, the inputs as sent, the cast."""
    from datetime import UTC, datetime

    from opencode_tui_core.calls.records import ModelCallRecord

    rd = RunDir.create(tmp_path, "r2")
    rd.append_event(TerminalOutput(stream="stdout", data="x\n"))
    rd.write_run_info(RunInfo(run_id="r2", task_id="t", provider="docker"))
    rd.write_text(RunFiles.VERIFY_STDOUT, "1 passed\n")
    rd.write_text(RunFiles.PROMPT, "Fix the bug.\n")
    rd.cast().output("hello\r\n")
    rd.close()
    when = datetime.now(UTC)
    with (rd.path / RunFiles.MODEL_CALLS).open("w") as f:
        for cid in ("c1", "c2"):
            f.write(
                ModelCallRecord(call_id=cid, method="POST", path="/v1/x", started_at=when).model_dump_json()
            )
            f.write("\n")
        f.write('{"call_id": "c3", "meth')  # a live run's torn last line
    reader = RunDirReader(rd.path)
    assert reader.info().provider == "docker"
    assert [e.data for e in reader.events()] == ["x\n"]
    assert reader.failures() == [] and reader.shells() == []
    assert [r.call_id for r in reader.model_calls()] == ["c1", "c2"]
    assert reader.model_call("c2").call_id == "c2" and reader.model_call("c3") is None
    assert reader.verifier_output() == ("1 passed\n", "")
    assert reader.prompt() == "Fix the bug.\n" and reader.instructions() is None
    assert reader.transcript() is None and reader.task_yaml() is None
    cast = reader.cast()
    assert cast is not None and cast.frames[0][1] == "hello\r\n"


def test_one_definition_of_a_run_directory(tmp_path):
    """``list_runs`` (batch, `runs --json`), the runs browser's scan and the reader agree on what is a run
    directory: run.json or events.jsonl, and a directory named as the engine names runs (its events.jsonl
    exists from its first moment) is listed without a file read."""
    from opencode_tui.runs_index import scan_runs

    runs = tmp_path / "runs"
    (runs / "copied").mkdir(parents=True)
    (runs / "copied" / RunFiles.RUN_INFO).write_text(
        RunInfo(run_id="copied", task_id="t", provider="local").model_dump_json()
    )
    (runs / "events-only").mkdir()
    (runs / "events-only" / RunFiles.EVENTS).write_text("")
    (runs / "hello-20261201-030637-ab12cd-a1").mkdir()
    (runs / "not-a-run").mkdir()
    (runs / "a-file").write_text("")
    listed = sorted(p.name for p, _ in list_runs(runs))
    assert listed == ["copied", "events-only", "hello-20261201-030637-ab12cd-a1"]
    assert sorted(e.name for e in scan_runs(runs)) == listed
    assert [e.task for e in scan_runs(runs) if e.name.startswith("hello")] == ["hello"]
    assert RunDirReader(runs / "copied").info().run_id == "copied"
    with pytest.raises(FileNotFoundError):
        RunDirReader(runs / "not-a-run")


def test_events_read_typed_filtered_or_raw_by_type(tmp_path):
    from opencode_tui_core.events import FailureRecorded, PhaseChanged, ToolCall
    from opencode_tui_core.failures import DEFAULT_POLICY, FailureEvent, FailureStage, decide

    rd = RunDir.create(tmp_path, "r")
    failure = FailureEvent(kind="agent_timeout", stage=FailureStage.AGENT, operation="run", message="late")
    decision = decide(failure, attempt=1, policy=DEFAULT_POLICY)
    # A tool call whose output quotes a failure event: its marker is escaped, it is no failure.
    quoted = ToolCall(call_id="t", tool="bash", status="completed", output='{"type":"failure"}')
    for seq, event in enumerate(
        (PhaseChanged(phase="agent"), TerminalOutput(stream="stdout", data="x" * 100), quoted), start=1
    ):
        rd.append_event(event.model_copy(update={"seq": seq}))
    rd.append_event(FailureRecorded(seq=4, failure=failure, decision=decision))
    rd.close()
    with (rd.path / RunFiles.EVENTS).open("a") as f:
        f.write('{"type": "phase", "seq": 5, "ph')  # a torn last line of a live run
    reader = RunDirReader(rd.path)
    with pytest.raises(ValueError):
        list(reader.events())
    assert [type(e) for e in reader.events(strict=False)] == [
        PhaseChanged,
        TerminalOutput,
        ToolCall,
        FailureRecorded,
    ]
    assert [type(e) for e in reader.events(skip=("terminal",), strict=False)] == [
        PhaseChanged,
        ToolCall,
        FailureRecorded,
    ]
    [raw] = reader.event_records(("failure",))
    assert raw["failure"]["kind"] == "agent_timeout" and raw["decision"]["action"] == decision.action
    batches = list(reader.event_batches(batch_size=2))
    assert [len(b) for b in batches] == [2, 2]
