"""The failure-kind vocabulary: registered ``<domain>_<condition>`` names.

Kinds carry no policy: retry, scoring and masking belong to the outcome policy. An unregistered kind
is kept as-is (never dropped or rewritten) and warned about once per process.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger(__name__)

# <domain>_<condition>, lowercase; extensions may namespace a kind as "<namespace>:<kind>".
_KIND_RE = re.compile(r"(?:[a-z][a-z0-9_-]*:)?[a-z][a-z0-9]*_[a-z0-9_]+")

_REGISTRY: dict[str, str] = {
    # admission: the request itself is unusable
    "task_invalid": "the task file or its referenced files are missing or malformed",
    "config_invalid": "the run configuration is invalid",
    # provider: the sandbox backend reported a condition about our sandbox
    "provider_oom_killed": "the kernel OOM-killed a process of this sandbox (authoritative evidence)",
    "provider_pids_limit_reached": "the sandbox hit its process limit and a fork failed (the cgroup's counter rose) when the agent failed",
    "provider_unavailable": "the sandbox backend (Docker engine, bwrap, OpenSandbox server) is not usable",
    "provider_quota_exhausted": "the backend refused for lack of quota",
    "provider_io_timeout": "a request to the backend did not answer within its deadline",
    "provider_image_missing": "the requested image does not exist on the backend",
    "provider_auth_failed": "the backend rejected our credentials (e.g. a missing or wrong API key)",
    "provider_protocol_error": "the backend answered something its API does not allow (unparseable, fields missing)",
    # sandbox: our sandbox's lifecycle and file/terminal operations
    "sandbox_allocation_failed": "creating the sandbox failed",
    "sandbox_not_ready": "the sandbox never became ready within its deadline",
    "sandbox_lost": "the sandbox failed, terminated or disappeared while in use",
    "sandbox_engine_lost": "the engine under the sandbox (Docker daemon, OpenSandbox server, the local keeper) went away or restarted while the sandbox was in use",
    "sandbox_file_failed": "an upload or download failed",
    "sandbox_pty_failed": "an interactive terminal failed",
    "sandbox_release_failed": "releasing or destroying the sandbox failed",
    "sandbox_disk_full": "the sandbox's writable space reached its size limit (writes failed with ENOSPC) and the agent failed",
    "sandbox_permission_denied": "the sandbox user cannot read its staged input or write its workdir",
    "image_build_failed": "building the task's image from its Dockerfile failed or timed out",
    # command: delivery and results of commands inside the sandbox
    "command_delivery_uncertain": "a command may have reached the sandbox but its result is unknown",
    "command_status_lost": "the command's status could not be recovered by its execution id",
    "command_hard_cap_expired": "the command outlived its hard cap; its outcome stays unknown",
    "command_failed": "a command the engine needed (not the agent) failed",
    "command_rejected": "the sandbox's daemon refused to start the command (it never ran)",
    "command_stream_lost": "a command's output stream broke while it ran; its result is followed by execution id",
    # install: OpenCode runtime preparation
    "install_failed": "installing the pinned OpenCode runtime failed",
    "install_integrity_mismatch": "the downloaded package does not match the registry's digest",
    "install_prerequisite_missing": "the sandbox lacks a required program (shell, python3)",
    "install_timeout": "the install did not finish within its budget",
    "install_registry_unreachable": "the package registry could not be reached or stopped answering (refused, DNS, reset, read timeout)",
    # agent: the OpenCode run itself
    "agent_timeout": "the run deadline fired (observed by the supervisor)",
    "agent_nonzero_exit": "OpenCode exited non-zero",
    "agent_did_not_finish": "OpenCode ended without a finished assistant turn",
    "agent_context_limit": "the conversation exhausted the model's context window",
    "agent_bootstrap_failed": "the supervisor or OpenCode could not be started",
    "agent_permission_rejected": "OpenCode asked for a permission nobody could grant (e.g. a path outside the workdir); the rejection ended the turn",
    # model: the model endpoint as seen by the recording proxy
    "model_rate_limited": "the model endpoint answered 429",
    "model_server_error": "the model endpoint answered 5xx",
    "model_unreachable": "the model endpoint could not be reached",
    "model_stalled": "the model stream stopped producing data",
    "model_malformed_response": "the model endpoint sent a response that could not be parsed",
    "model_api_error": "the model endpoint rejected the request (4xx other than 429)",
    "model_empty_response": "the model endpoint's answers gave the agent nothing (empty, choice-less or "
    "unterminated 2xx, no text, tool call or token), call after call: the agent was stopped",
    # cleanup and transcript
    "cleanup_unconfirmed": "no positive cleanup receipt within the close budget",
    "supervisor_lost": "the supervisor died without a receipt; cleanup was proven by destroying the sandbox",
    "transcript_export_failed": "the transcript snapshot or export failed",
    # artifacts: the run directory on the controller
    "artifacts_write_failed": "the run directory could not be written (disk full, read-only, removed)",
    # verification
    "verifier_error": "the verifier could not be run or crashed",
    "verifier_timeout": "the verifier's own deadline fired before it finished",
    "verifier_unknown_exit": "the verifier's exit was not observed, and its deadline did not fire",
    "verification_inconclusive": "the verifier ran but its result could not be read",
    # executor: where the episode ran (a Ray worker on some node)
    "executor_worker_lost": "the worker process or node running the episode died mid-episode (killed, "
    "OOM-killed by its node, node lost); that node's sandboxes of the run are swept",
    # lifecycle
    "run_cancelled": "the run was cancelled by the user",
    "run_interrupted": "the controller died mid-episode (SIGKILL, power loss): no outcome, cleanup unknown",
    "human_intervened": "a person used a shell in the sandbox or acted on the agent through the debugger "
    "before verification finished",
    # rerun (issue 28)
    "replay_diverged": "a rerun's request differed from the recorded one and the rerun was stopped there "
    "(--on-divergence stop): not a sample",
}

_warned: set[str] = set()
_lock = threading.Lock()


def register_kind(name: str, description: str) -> None:
    """Add a kind to the vocabulary (for extensions); the name must follow ``<domain>_<condition>``."""
    if not _KIND_RE.fullmatch(name):
        raise ValueError(
            f"failure kind {name!r} must look like <domain>_<condition> (lowercase, underscores)"
        )
    _REGISTRY[name] = description


def is_registered(name: str) -> bool:
    return name in _REGISTRY


def describe(name: str) -> str | None:
    return _REGISTRY.get(name)


def registered_kinds() -> dict[str, str]:
    return dict(_REGISTRY)


def check_kind(name: str) -> str:
    """Return ``name`` unchanged; warn once per process when it is not registered."""
    if name not in _REGISTRY:
        with _lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            shape = "" if _KIND_RE.fullmatch(name) else " (and it does not look like <domain>_<condition>)"
            log.warning("unregistered failure kind %r kept as-is%s", name, shape)
    return name
