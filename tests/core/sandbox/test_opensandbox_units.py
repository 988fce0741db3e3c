"""OpenSandbox provider pieces that need no server: policy rules, protocol facts, report parsing.

The report samples are the formats opensandbox-server 1.1.1's Docker runtime produces (captured
from the real server on this machine); the server-backed behaviour is in ``test_opensandbox.py``.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from opencode_tui_core.config import AgentConfig, load_config
from opencode_tui_core.failures import Delivery, Evidence
from opencode_tui_core.sandbox.oom import oom_confirmed
from opencode_tui_core.sandbox.opensandbox.common import _Run, _shell_command, label_value
from opencode_tui_core.sandbox.opensandbox.diagnostics import (
    diagnostics_evidence,
    lifecycle_evidence,
    parse_events_text,
    parse_inspect_text,
)
from opencode_tui_core.sandbox.opensandbox.http import classify_status
from opencode_tui_core.sandbox.opensandbox.oom_rules import SOURCE_OS_DIAGNOSTICS, SOURCE_OS_LIFECYCLE
from opencode_tui_core.sandbox.opensandbox.policy import (
    DEFAULT_OPENSANDBOX_POLICY,
    decide_request,
    merged_policy,
)
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxPolicyOverrides, OpenSandboxSettings

SID = "eda9e4ae-b154-4e38-80ae-43a87bf11b62"
OTHER = "fbcb9ccb-124f-411c-9c51-8daf536cf82e"

EVENTS_OOM = f"""Container:  bcc1cb99e7da (sandbox-{SID})
Status:     exited
Created:    2026-11-29T11:20:54.818423908Z
Started:    2026-11-29T11:20:55.982900994Z
Finished:   2026-11-29T11:20:56.513229766Z
Event:      OOMKilled - container was killed due to out-of-memory
Event:      Exited with code 137"""

EVENTS_RUNNING = f"""Container:  51394d0fe276 (sandbox-{SID})
Status:     running
Created:    2026-11-29T11:20:41.532509868Z
Started:    2026-11-29T11:20:42.550915023Z"""

INSPECT_OOM = f"""Container ID:   bcc1cb99e7da
Name:           sandbox-{SID}
Image:          opencode-tui/base:bookworm
Status:         exited
Running:        False
Paused:         False
OOMKilled:      True
Exit Code:      137
Started At:     2026-11-29T11:20:55.982900994Z
Finished At:    2026-11-29T11:20:56.513229766Z

Resources:
  CPU:          1.00 cores
  Memory:       128 MiB
  PIDs Limit:   4096

Labels:
  opencode-tui.run=manual-try
  opensandbox.io/id={SID}
"""


def _events(content: str, admitted: bool = True, **kw: object) -> Evidence:
    """A ``diagnostics/events`` report, admitted as OOM evidence (``oom_from_diagnostics`` on) by default."""
    return diagnostics_evidence(
        SID,
        "diagnostics/events",
        parse_events_text(content),
        content=content,
        admitted=admitted,
        **kw,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------------------------------ policy


def test_policy_precedence_is_status_then_kind_then_default_operation_scoped_first() -> None:
    policy = merged_policy(
        DEFAULT_OPENSANDBOX_POLICY,
        OpenSandboxPolicyOverrides(
            http_status={"status:503": "fail", "5xx": "retry"},
            kind={"status:provider_unavailable": "fail"},
            default="fail",
        ),
    )

    def pick(op: str, status: int | None, kind: str = "x_y") -> tuple[str, str]:
        d = decide_request(policy, operation=op, http_status=status, kind=kind)
        return d.action.value, d.rule

    assert pick("status", 503) == ("fail", "status:503")  # operation + exact status
    assert pick("create", 500) == ("fail", "create:5xx")  # operation + status class (a default)
    assert pick("status", 502) == ("retry", "502")  # exact status before its class
    assert pick("read", 500) == ("retry", "5xx")  # the override's class rule
    assert pick("status", None, "provider_unavailable") == ("fail", "status:provider_unavailable")
    assert pick("read", None, "provider_unavailable") == ("retry", "provider_unavailable")
    assert pick("read", 418) == ("fail", "default")


def test_overrides_merge_key_by_key_and_field_by_field() -> None:
    overrides = OpenSandboxPolicyOverrides.model_validate(
        {
            "command_timeout_headroom_s": 30,
            "status_recovery": {"enabled": False},
            "diagnostic_timeouts": {"events_s": 9},
            "attempts": {"submit": {"max_attempts": 2}},
            "http_status": {"submit:502": "fail"},
        }
    )
    policy = merged_policy(DEFAULT_OPENSANDBOX_POLICY, overrides)
    assert policy.command_timeout_headroom_s == 30
    assert policy.status_recovery.enabled is False
    assert policy.status_recovery.poll_initial_s == DEFAULT_OPENSANDBOX_POLICY.status_recovery.poll_initial_s
    assert policy.diagnostic_timeouts.events_s == 9
    assert (
        policy.diagnostic_timeouts.lifecycle_s == DEFAULT_OPENSANDBOX_POLICY.diagnostic_timeouts.lifecycle_s
    )
    assert policy.budget("submit").max_attempts == 2
    assert policy.budget("submit").max_delay_s == DEFAULT_OPENSANDBOX_POLICY.budget("submit").max_delay_s
    assert policy.http_status["submit:502"].value == "fail"
    assert policy.http_status["502"].value == "retry"  # untouched defaults stay
    assert merged_policy(DEFAULT_OPENSANDBOX_POLICY, None) is DEFAULT_OPENSANDBOX_POLICY


@pytest.mark.parametrize(
    "policy",
    [
        {"http_status": {"bogus:502": "fail"}},
        {"http_status": {"6xx": "retry"}},
        {"kind": {"submit:NotAKind": "retry"}},
        {"attempts": {"nowhere": {"max_attempts": 2}}},
        {"http_status": {"502": "resubmit"}},
        {"unknown_knob": 1},
    ],
)
def test_bad_policy_is_rejected(policy: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OpenSandboxSettings(policy=policy)  # type: ignore[arg-type]


def test_settings_load_from_a_config_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.yaml"
    path.write_text(
        "sandbox:\n  provider: opensandbox\n  opensandbox:\n    url: http://127.0.0.1:18089/\n"
        "    max_connections: 4\n    policy:\n      http_status: {'submit:502': fail}\n"
    )
    config = load_config(path)
    assert isinstance(config, AgentConfig)
    settings = config.sandbox.opensandbox
    assert settings.url == "http://127.0.0.1:18089" and settings.max_connections == 4
    assert settings.policy.http_status == {"submit:502": "fail"}


# --------------------------------------------------------------------------------- protocol facts


def test_delivery_is_a_protocol_fact() -> None:
    def cls(status: int, op: str, code: str | None = None) -> tuple[str, Delivery]:
        return classify_status(
            status, code, operation=op, default_kind="k_default", not_found_kind="k_missing"
        )

    assert cls(502, "submit") == ("provider_unavailable", Delivery.NOT_SENT)  # never started
    assert cls(502, "create")[1] is Delivery.POSSIBLY_DELIVERED  # may have landed
    assert cls(500, "submit") == ("k_default", Delivery.POSSIBLY_DELIVERED)
    assert cls(422, "create") == ("k_default", Delivery.NOT_SENT)
    assert cls(429, "create") == ("provider_quota_exhausted", Delivery.NOT_SENT)
    assert cls(400, "create", "SANDBOX::QUOTA_EXCEEDED")[0] == "provider_quota_exhausted"
    assert cls(401, "read", "MISSING_API_KEY") == ("provider_auth_failed", Delivery.NOT_SENT)
    assert cls(404, "read") == ("k_missing", Delivery.NOT_SENT)


def test_exit_reports_are_never_rewritten() -> None:
    run = _Run("ex-1", ["true"], None)
    run.set_exit("3")
    assert (run.exit_code, run.signal) == (3, None)
    killed = _Run("ex-2", ["true"], None)
    killed.set_exit("signal: killed")
    assert (killed.exit_code, killed.signal) == (None, 9)
    odd = _Run("ex-3", ["true"], None)
    odd.set_exit("something else")
    assert (odd.exit_code, odd.signal, odd.remote_error) == (None, None, "something else")


def test_labels_and_commands() -> None:
    assert label_value("root@host.example") == "root_host.example"
    assert label_value("-x-") == "x"
    assert label_value("@@@") == "none"
    assert len(label_value("a" * 100)) == 63
    assert _shell_command(["echo", "a b"], None) == "echo 'a b'"
    assert _shell_command(["cat"], "/tmp/in") == "exec 0</tmp/in && rm -f -- /tmp/in && exec cat"


# --------------------------------------------------------------------------- reports and evidence


def test_server_report_of_this_container_confirms_oom() -> None:
    events = _events(EVENTS_OOM)
    assert events.data["OOMKilled"] is True and events.data["subject"] == SID
    assert events.data["exit_code"] == 137
    assert oom_confirmed([events], scope=SID) is events
    inspect = diagnostics_evidence(SID, "diagnostics/inspect", parse_inspect_text(INSPECT_OOM), admitted=True)
    assert inspect.data["OOMKilled"] is True and inspect.data["subject"] == SID
    assert inspect.data["memory_limit_bytes"] == 128 << 20
    assert oom_confirmed([inspect], scope=SID) is inspect


def test_diagnostics_reports_confirm_only_when_admitted_by_the_opt_in_setting() -> None:
    """The reports are display text (the diagnostics API says not to parse their lines): the same
    report that confirms when ``oom_from_diagnostics`` is on confirms nothing by default."""
    assert OpenSandboxSettings().oom_from_diagnostics is False
    events = _events(EVENTS_OOM, admitted=False)
    inspect = diagnostics_evidence(SID, "diagnostics/inspect", parse_inspect_text(INSPECT_OOM))
    assert events.data["OOMKilled"] is True and inspect.data["OOMKilled"] is True  # parsed, kept for people
    assert (events.data["admitted"], inspect.data["admitted"]) == (False, False)
    assert oom_confirmed([events, inspect], scope=SID) is None


def test_running_report_says_no_oom() -> None:
    events = _events(EVENTS_RUNNING)
    assert events.data["OOMKilled"] is False
    assert oom_confirmed([events], scope=SID) is None


def test_report_about_another_container_is_not_evidence() -> None:
    # A stale report of another sandbox's container returned for ours, and a sidecar's report.
    stale = _events(EVENTS_OOM.replace(SID, OTHER))
    sidecar = _events(EVENTS_OOM.replace(f"sandbox-{SID}", f"sandbox-egress-{SID}"))
    assert stale.data["subject"] == OTHER
    assert oom_confirmed([stale, sidecar], scope=SID) is None
    assert sidecar.data["subject"] == f"egress-{SID}"  # named after ours, but not ours
    assert stale.scope == SID  # asked about ours: the report's own subject disqualifies it
    contradictory = parse_inspect_text(
        INSPECT_OOM.replace(f"opensandbox.io/id={SID}", f"opensandbox.io/id={OTHER}")
    )
    assert contradictory["subject"] is None


def test_oom_flag_already_set_when_we_connected_is_stale() -> None:
    borrowed = _events(EVENTS_OOM, oom_at_connect=True)
    assert oom_confirmed([borrowed], scope=SID) is None


@pytest.mark.parametrize(
    "content",
    [
        "",
        "(no notable events)",
        "Killed\nout of memory\nexit code 137",  # output text, not a report
        "Some future format: OOMKilled=yes",
        f"Status: exited\nEvent: OOMKilled - container was killed due to out-of-memory\nName: sandbox-{SID}",
    ],
)
def test_ambiguous_or_unrecognised_reports_are_not_evidence(content: str) -> None:
    ev = _events(content)
    assert oom_confirmed([ev], scope=SID) is None
    inspect = diagnostics_evidence(SID, "diagnostics/inspect", parse_inspect_text(content), admitted=True)
    assert oom_confirmed([inspect], scope=SID) is None


CODES = OpenSandboxSettings().oom_reason_codes  # the recognised lifecycle OOM reason codes (default)


def _lifecycle(reason: str | None, message: str, *, state: str = "Failed", sid: str = SID) -> Evidence:
    body = {"id": sid, "status": {"state": state, "reason": reason, "message": message}}
    return lifecycle_evidence(SID, body, oom_reason_codes=CODES)


@pytest.mark.parametrize(
    "reason, message",
    [
        # A program's own words in the status message: not a kernel report (this once confirmed an OOM).
        ("CONTAINER_EXITED_ERROR", "npm ERR! JavaScript heap out of memory"),
        ("CONTAINER_EXITED_ERROR", "Sandbox container exited with code 137 (out of memory)"),
        ("CONTAINER_EXITED_ERROR", "OOMKilled"),
        ("runtime_error", "oom kill"),
        (None, "Out Of Memory: Killed process 42 (node)"),
        # Codes are matched exactly: no case folding, no substrings.
        ("oomkilled", "container exited"),
        ("NOT_OOMKilled", "container exited"),
        ("OOMKilled ", "container exited"),
    ],
)
def test_lifecycle_text_never_confirms_an_oom(reason: str | None, message: str) -> None:
    ev = _lifecycle(reason, message)
    assert ev.data["oom_reported"] is False and ev.data["oom_reason_code"] is None
    assert oom_confirmed([ev], scope=SID) is None


def test_lifecycle_oom_needs_a_recognised_code_in_a_terminal_state_of_this_sandbox() -> None:
    named = _lifecycle("OOMKilled", "exited with code 137")
    assert named.source == SOURCE_OS_LIFECYCLE and named.data["oom_reason_code"] == "OOMKilled"
    assert oom_confirmed([named], scope=SID) is named
    assert oom_confirmed([_lifecycle("OOMKilled", "", state="Terminated")], scope=SID) is not None
    # Not terminal (the container still runs), or another sandbox's record: no confirmation.
    assert oom_confirmed([_lifecycle("OOMKilled", "", state="Running")], scope=SID) is None
    assert _lifecycle("OOMKilled", "", sid=OTHER).data["oom_reported"] is False
    # A deployment's own code is recognised once configured, exactly.
    custom = lifecycle_evidence(
        SID,
        {"id": SID, "status": {"state": "Failed", "reason": "SANDBOX_OOM"}},
        oom_reason_codes=OpenSandboxSettings(oom_reason_codes=["SANDBOX_OOM"]).oom_reason_codes,
    )
    assert oom_confirmed([custom], scope=SID) is custom
    exit_137 = _lifecycle("CONTAINER_EXITED_ERROR", "Sandbox container exited with code 137.")
    text = Evidence(source="exec.output", scope=SID, data={"text": "Killed (OOMKilled)", "exit_code": 137})
    assert oom_confirmed([text, exit_137], scope=SID) is None
    assert SOURCE_OS_DIAGNOSTICS == "opensandbox.diagnostics"


def test_a_commands_run_notes_are_capped() -> None:
    """Notes on one command (an unparseable event skipped, each one) are capped for its result, which
    says how many were left out (issue 25)."""
    from opencode_tui_core.sandbox.opensandbox.common import RUN_NOTES_KEPT, _Run

    run = _Run("ex-1", ["sh"], None)
    for i in range(RUN_NOTES_KEPT + 30):
        run.note(f"an unparseable event was skipped: {i}")
    error = run.result(exit_code=0, observed=True).error
    assert error is not None and error.count("an unparseable event was skipped") == RUN_NOTES_KEPT
    assert error.endswith("30 more note(s) omitted")
