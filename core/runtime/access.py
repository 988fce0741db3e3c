"""The sandbox user of an episode: who runs the harness, OpenCode, the shell and the verifier; the
inputs staged as that user's; and the seed-phase preflight proving the user can use them.

The user is decided once per episode: ``sandbox.user`` in the config, else ``user:`` in task.yaml,
else the image's (or the provider's) own user. Providers apply a requested user when they create
the sandbox (``SandboxSpec.user``), so every exec and terminal runs as it without being told; the
engine then asks the sandbox who that is (``Sandbox.identify``) and stages with those ids.

Staging never relies on the controller's umask or on who extracts: every archive carries explicit
modes and the user's uid/gid, and the directories that must be the user's (the workdir, the session
directory) are entries of the archive themselves (``root_mode``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from opencode_tui_core.events import Event, Warning_
from opencode_tui_core.failures import FailureEvent, FailureStage, GenericDetails
from opencode_tui_core.sandbox.base import (
    SANDBOX_MODEL_SOCKET,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxUser,
    describe_exit,
)
from opencode_tui_core.sandbox.tarsafe import directory_tar, tree_tar

# The workdir belongs to the sandbox user; others may read it (a root verifier, a shell as root).
WORKDIR_MODE = 0o755
# OpenCode's session directory (config, XDG dirs, input, logs) is the user's alone.
SESSION_DIR_MODE = 0o700
# The model proxy's socket: connect() needs write permission, so this is who may reach the model.
SOCKET_MODE = 0o600
PERMISSION_KIND = "sandbox_permission_denied"
# How many denied paths a failure names (the rest are counted).
_SHOWN = 10


class SandboxPermissionDenied(Exception):
    """The sandbox user cannot use its inputs; ``failure`` names the user, the paths and their modes."""

    def __init__(self, failure: FailureEvent) -> None:
        super().__init__(failure.message)
        self.failure = failure


def requested_user(
    config_user: str | None, task_user: str | None
) -> tuple[str | None, Literal["image", "config", "task"]]:
    """The user asked for, and who asked: the config wins over the task; None keeps the image's."""
    if config_user:
        return config_user, "config"
    if task_user:
        return task_user, "task"
    return None, "image"


async def establish_user(
    sandbox: Sandbox,
    requested: str | None,
    source: Literal["image", "config", "task"],
    *,
    borrowed: bool,
    emit: Callable[[Event], Any],
) -> SandboxUser:
    """Who the sandbox runs commands as: the requested user was applied at create; a borrowed
    sandbox keeps its own (said in a warning). Raises SandboxError when ``id`` cannot tell."""
    if requested is not None and borrowed:
        emit(
            Warning_(
                code="sandbox_user_ignored",
                message=f"user {requested!r} is not applied to a borrowed sandbox: "
                "commands run as the sandbox's own user",
            )
        )
        source = "image"
    user = await sandbox.identify()
    return user.model_copy(update={"source": source})


async def stage_inputs(
    sandbox: Sandbox, files_dir: Path | None, workdir: str, user: SandboxUser, model_socket: str | None
) -> None:
    """The seed phase's inputs, as the user's: the model socket (host path, when bound into the
    sandbox), the task files and the workdir; then the preflight. Raises SandboxError (upload) or
    SandboxPermissionDenied (the user cannot use them)."""
    if model_socket is not None:
        grant_model_socket(sandbox, user, model_socket)
    inputs = await stage_task_files(sandbox, files_dir, workdir, user)
    await preflight(sandbox, user, workdir, inputs, model_socket=model_socket is not None)


def grant_model_socket(sandbox: Sandbox, user: SandboxUser, host_path: str) -> None:
    """Give the model proxy's socket to the sandbox user only (it is bound into the sandbox).

    The socket was created under the controller's umask; as it is seen inside, it must belong to the
    user with mode 0600. Where the provider shares no host file, or the engine may not change the
    owner, nothing is done here and the preflight reports what the user cannot reach.
    """
    ids = sandbox.host_ids(user)
    if ids is None:
        return
    try:
        if (os.stat(host_path).st_uid, os.stat(host_path).st_gid) != ids:
            os.chown(host_path, *ids)
        os.chmod(host_path, SOCKET_MODE)
    except PermissionError:
        pass  # an unprivileged engine cannot give it away: the preflight names it


async def stage_task_files(
    sandbox: Sandbox, files_dir: Path | None, workdir: str, user: SandboxUser
) -> list[str]:
    """Upload the task files into the workdir, all owned by the user; the workdir itself too.

    Modes are the task files' own (a file made unreadable on purpose stays so, and the preflight
    says it). Returns the staged paths, relative to the workdir, for the preflight.
    """
    archive, inputs = await task_archive(files_dir, user)
    await sandbox.upload_tar(workdir, archive)
    return inputs


async def task_archive(files_dir: Path | None, user: SandboxUser) -> tuple[bytes, list[str]]:
    """The task files as the workdir's archive (the workdir an entry of it, the user's), and their
    paths relative to it."""
    if files_dir is None:
        return tree_tar({}, owner=user.ids, root_mode=WORKDIR_MODE), []
    archive = directory_tar(files_dir, owner=user.ids, root_mode=WORKDIR_MODE)
    return archive, await asyncio.to_thread(_relative_paths, files_dir)


def _relative_paths(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ``sh -c PREFLIGHT_SH sh WORKDIR SOCKET``. Reads paths (one per line, relative to the workdir) on
# stdin; prints one line per denial: need <TAB> path <TAB> mode <TAB> uid:gid.
# Runs as the sandbox user, so `test` answers for it.
PREFLIGHT_SH = r"""
wd=$1; sock=$2
deny() {
  m=$(stat -c '%a %u:%g' -- "$2" 2>/dev/null) || m='? ?'
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "${m% *}" "${m#* }"
}
if [ ! -d "$wd" ] || [ ! -x "$wd" ]; then deny enter "$wd"; exit 0; fi
probe="$wd/.opencode-tui-write-probe-$$"
if ( : > "$probe" ) 2>/dev/null; then rm -f -- "$probe"; else deny write "$wd"; fi
while IFS= read -r rel; do
  p="$wd/$rel"
  [ -L "$p" ] && continue
  if [ -d "$p" ]; then
    { [ -r "$p" ] && [ -x "$p" ]; } || deny read "$p"
  elif [ -e "$p" ]; then
    [ -r "$p" ] || deny read "$p"
  else
    deny read "$p"
  fi
done
if [ -n "$sock" ] && [ -e "$sock" ] && [ ! -w "$sock" ]; then deny connect "$sock"; fi
exit 0
"""


# The preflight's bound, wherever it runs (an exec, or the runner started ahead: opencode_tui_core.episode.handoff).
PREFLIGHT_TIMEOUT_S = 60.0


def preflight_listing(inputs: list[str]) -> str:
    """The preflight's standard input: the staged paths, one per line."""
    return "".join(f"{p}\n" for p in inputs if "\n" not in p)


async def preflight(
    sandbox: Sandbox, user: SandboxUser, workdir: str, inputs: list[str], *, model_socket: bool
) -> None:
    """Check, as the sandbox user, that it can read every staged input, write the workdir and
    (model-only network) reach the model proxy's socket; raise SandboxPermissionDenied otherwise."""
    sock = SANDBOX_MODEL_SOCKET if model_socket else ""
    try:
        r = await sandbox.exec(
            ["/bin/sh", "-c", PREFLIGHT_SH, "sh", workdir, sock],
            cwd="/",
            stdin=preflight_listing(inputs).encode(),
            timeout=PREFLIGHT_TIMEOUT_S,
        )
    except SandboxError as exc:
        raise SandboxPermissionDenied(
            FailureEvent.from_exception(
                exc,
                kind=PERMISSION_KIND,
                stage=FailureStage.SEED,
                operation="check the sandbox user's access",
            )
        ) from exc
    judge_preflight(r, user)


def judge_preflight(r: ExecResult, user: SandboxUser) -> None:
    """What the preflight printed, judged: raise SandboxPermissionDenied naming what the user cannot
    use (or that the check did not run); nothing when every input is usable."""
    if not r.ok:
        detail = (
            r.stderr.decode("utf-8", "replace").strip()[:300]
            or r.error
            or describe_exit(r.exit_code, r.signal)
        )
        raise SandboxPermissionDenied(
            FailureEvent(
                kind=PERMISSION_KIND,
                stage=FailureStage.SEED,
                operation="check the sandbox user's access",
                message=f"the access check as {user.label} did not run: {detail}",
            )
        )
    denied = []
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            need, path, mode, owner = parts
            denied.append({"need": need, "path": path, "mode": mode, "owner": owner})
    if not denied:
        return
    first = denied[0]
    more = f" (and {len(denied) - 1} more)" if len(denied) > 1 else ""
    message = (
        f"the sandbox user {user.label} cannot {first['need']} {first['path']} "
        f"(mode {_mode(first['mode'])}, owner {first['owner']}){more}; "
        "fix the task files' modes or the image's user (sandbox.user / task.yaml user:)"
    )
    raise SandboxPermissionDenied(
        FailureEvent(
            kind=PERMISSION_KIND,
            stage=FailureStage.SEED,
            operation="check the sandbox user's access",
            message=message,
            details=GenericDetails(
                data={
                    "user": user.name,
                    "uid": user.uid,
                    "gid": user.gid,
                    "denied": denied[:_SHOWN],
                    "denied_count": len(denied),
                }
            ),
        )
    )


def _mode(text: str) -> str:
    return text.zfill(3) if text.isdigit() else text
