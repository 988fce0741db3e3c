"""``opencode-tui attach`` and ``opencode-tui sweep``: come back to a kept sandbox, remove leftovers.

Which sandboxes ``sweep`` removes (every one must carry our owner label, ``$OPENCODE_TUI_OWNER`` or
user@host, unless ``--all-owners``):

* ``sweep ID...``: exactly those (a Docker id may be given by a unique prefix of 12+ characters),
  kept or not. An id that is not a sandbox of ours: one line, exit 2, nothing removed.
* ``sweep --run RUN_ID``: that run's sandboxes (label ``opencode-tui.run``), kept or not.
* ``sweep --batch BATCH_ID``: that batch's leftovers (label ``opencode-tui.batch``, the id on every
  result line of ``run --batch``), kept or not, but never one whose creating process still runs
  (the batch is still going); with ``--run`` too, that run's of the batch.
* ``sweep``: only leftovers, i.e. sandboxes whose creating process is provably gone (label
  ``opencode-tui.invocation``: host, boot, pid and start time); never another live job's, never one
  made in another host or PID namespace, and never a kept one unless ``--kept`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.exit_codes import ExitCode

_SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]


class UsageError(Exception):
    """Bad input, phrased for the user: printed as one line, exit 2, nothing touched."""


# ---- sweep ------------------------------------------------------------------------------------


def cmd_sweep(args: argparse.Namespace) -> int:
    from opencode_tui_core import sweep_selection as sweeping

    owner = None if args.all_owners else sweeping.default_owner()
    names = sweeping.provider_names(args.provider)
    request = sweeping.SweepRequest(ids=args.ids, run=args.run, batch=args.batch, kept=args.kept)

    def skipped(name: str, exc: Exception) -> None:
        print(f"opencode-tui sweep: {name}: skipped ({exc})", file=sys.stderr)

    async def sweep() -> int:
        try:
            found = await sweeping.list_ours(names, owner, strict=args.provider != "all", on_skip=skipped)
        except Exception as exc:
            print(f"opencode-tui sweep: {exc}", file=sys.stderr)
            return ExitCode.INFRA
        try:
            selection = sweeping.select(request, found)
        except sweeping.SweepRefused as exc:
            print(f"opencode-tui sweep: {str(exc).replace('{owner}', owner or 'any')}", file=sys.stderr)
            return ExitCode.USAGE
        verb = "would remove" if args.dry_run else "removed"
        failed = False
        for item in selection.chosen:
            record = item.record
            if not args.dry_run:
                try:
                    await sweeping.remove(item)
                except Exception as exc:
                    failed = True
                    print(f"opencode-tui sweep: {record.sandbox_id}: {exc}", file=sys.stderr)
                    continue
            line = {"provider": record.provider, "sandbox_id": record.sandbox_id, "action": verb}
            print(json.dumps({**line, "batch_id": item.batch_id}))
        notes = [f"{verb} {len(selection.chosen)} sandbox(es)"]
        if args.batch and selection.live:
            notes.append(f"left {selection.live} whose process still runs (the batch is not over)")
        if not request.explicit:
            notes.append(
                f"left {selection.live} of live jobs, {selection.kept} kept (--kept or name them), "
                f"{selection.elsewhere} made on another host or PID namespace (name them)"
            )
        print("; ".join(notes), file=sys.stderr)
        return ExitCode.INFRA if failed else ExitCode.OK

    return asyncio.run(sweep())


# ---- attach -----------------------------------------------------------------------------------


def _read_run(run_dir: Path) -> dict[str, Any]:
    """run.json as plain data: attach must work on a record written by another version too."""
    from opencode_tui_core.artifacts import RunDirReader, RunFiles

    try:
        return RunDirReader(run_dir, check=False).info_data()
    except FileNotFoundError as exc:
        raise UsageError(f"{run_dir} is not a run directory (no {RunFiles.RUN_INFO})") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"{run_dir}/{RunFiles.RUN_INFO} is unreadable: {exc}") from exc


def _target(ref: str) -> tuple[str, str, dict[str, Any], Path | None]:
    """(provider, sandbox id, run.json or {}, run dir) of a kept sandbox named by run dir or id."""
    from opencode_tui_core.sandbox import find_kept

    path = Path(ref)
    if path.is_dir():
        run = _read_run(path)
        sid, provider = run.get("sandbox_id"), run.get("provider")
        if not sid or not provider:
            raise UsageError(f"run {path.name} never had a sandbox; nothing to attach to")
        if not run.get("sandbox_kept"):
            raise UsageError(
                f"run {path.name} did not keep its sandbox {sid} (it was released at the end); "
                "run the task with --keep-sandbox (or press k) to come back to it"
            )
        return str(provider), str(sid), run, path
    records = find_kept(ref)
    if not records:
        raise UsageError(
            f"{ref!r} is neither a run directory nor a kept sandbox id "
            "(list kept sandboxes with `opencode-tui sweep --dry-run --kept`)"
        )
    if len(records) > 1:
        raise UsageError(f"{ref!r} matches {len(records)} kept sandboxes; give more of the id")
    record = records[0]
    run = {}
    run_dir = Path(record.run_dir) if record.run_dir else None
    if run_dir is not None:
        try:
            run = _read_run(run_dir)
        except UsageError:
            run_dir = None
    return record.provider, record.sandbox_id, run, run_dir


def _recorded(handle: Any, run_dir: Path | None, cols: int, rows: int, user: str | None) -> Any:
    """The shell recorded in the run directory like any shell (its own cast, shell_opened/closed).

    After the run it is post-mortem: it marks nothing (``marks_sample`` false, phase ``done``)."""
    from opencode_tui_core.artifacts import RunDir, RunDirReader
    from opencode_tui_core.events import Phase, ShellClosed, ShellOpened
    from opencode_tui_core.shells import RecordedShell

    if run_dir is None or not os.access(run_dir, os.W_OK):
        return handle
    reader = RunDirReader(run_dir, check=False)
    seq = max((e.seq for e in reader.events()), default=0)
    n = len(reader.shell_casts()) + 1
    writer = RunDir(run_dir)
    cast_name, cast = writer.shell_cast(n, cols, rows)
    seq += 1
    writer.append_event(
        ShellOpened(seq=seq, shell=n, phase=Phase.DONE, marks_sample=False, cast=cast_name, user=user)
    )

    def closed(duration_s: float, bytes_in: int, bytes_out: int) -> None:
        writer.append_event(
            ShellClosed(seq=seq + 1, shell=n, duration_s=duration_s, bytes_in=bytes_in, bytes_out=bytes_out)
        )
        writer.close()

    return RecordedShell(handle, cast, closed)


def _sandbox_user(run: dict[str, Any]) -> str | None:
    """The run's sandbox user when run.json records one (``sandbox_user``: a name, uid or dict)."""
    user = run.get("sandbox_user")
    if isinstance(user, dict):
        user = user.get("name") or user.get("uid")
    return str(user) if user not in (None, "") else None


def _config(run: dict[str, Any]) -> AgentConfig:
    try:
        return AgentConfig.model_validate(run.get("config") or {})
    except Exception:
        return AgentConfig()


async def _connect(provider_name: str, sandbox_id: str, run: dict[str, Any]) -> Any:
    from opencode_tui_core.sandbox import get_provider

    try:
        provider = get_provider(provider_name, _config(run))
    except ValueError as exc:
        raise UsageError(f"unknown provider {provider_name!r} in the run record") from exc
    try:
        return await provider.connect(sandbox_id)
    except Exception as exc:
        raise UsageError(
            f"sandbox {sandbox_id} ({provider_name}) no longer exists or cannot be reached: {exc}; "
            "it may have been swept"
        ) from exc


def _terminal_size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.columns, size.lines
    except OSError:
        return 80, 24


async def _interact(handle: Any) -> None:
    """Pump the caller's terminal to the sandbox's and back until the shell exits."""
    loop = asyncio.get_running_loop()
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    writes: asyncio.Queue[bytes] = asyncio.Queue()

    def on_input() -> None:
        try:
            data = os.read(stdin, 65536)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(stdin)
        writes.put_nowait(data)

    async def forward() -> None:
        while data := await writes.get():
            await handle.write(data)
        # Our input ended (a pipe or a file; a terminal's ^D arrives as a byte in raw mode). The
        # shell is told to exit after what it was given: a ^D would not do, since the shell's line
        # editor takes it as delete-char on an unfinished last line, and it is lost if it arrives
        # while a command runs. The newline finishes a last line that had none.
        await handle.write(b"\nexit\n")

    resizes: set[asyncio.Task[None]] = set()

    def on_resize() -> None:
        cols, rows = _terminal_size()
        task = loop.create_task(handle.resize(cols, rows))
        resizes.add(task)
        task.add_done_callback(resizes.discard)

    loop.add_reader(stdin, on_input)
    loop.add_signal_handler(signal.SIGWINCH, on_resize)
    writer = asyncio.ensure_future(forward())
    try:
        while data := await handle.read():
            os.write(stdout, data)
    finally:
        writer.cancel()
        loop.remove_reader(stdin)
        loop.remove_signal_handler(signal.SIGWINCH)


def cmd_attach(args: argparse.Namespace) -> int:
    try:
        provider_name, sandbox_id, run, run_dir = _target(args.target)
    except UsageError as exc:
        print(f"opencode-tui attach: {exc}", file=sys.stderr)
        return ExitCode.USAGE

    async def attach() -> int:
        from opencode_tui_core import provider_registry as registry

        try:
            sandbox = await _connect(provider_name, sandbox_id, run)
        except UsageError as exc:
            print(f"opencode-tui attach: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        try:
            cols, rows = _terminal_size()
            kwargs: dict[str, Any] = {"cols": cols, "rows": rows}
            user = _sandbox_user(run)
            if user is not None and "user" in inspect.signature(sandbox.pty).parameters:
                kwargs["user"] = user
            handle = _recorded(await sandbox.pty(_SHELL, **kwargs), run_dir, cols, rows, user)
            shown = registry.get(provider_name).short_id(sandbox_id)
            print(
                f"attached to {provider_name} sandbox {shown} (kept; exit the shell to leave, "
                f"`opencode-tui sweep {shown}` to remove it)\r",
                file=sys.stderr,
            )
            saved = _raw(sys.stdin.fileno())
            try:
                await _interact(handle)
            finally:
                _restore(sys.stdin.fileno(), saved)
                await handle.close()
        except Exception as exc:
            print(f"opencode-tui attach: the shell in {sandbox_id} failed: {exc}", file=sys.stderr)
            return ExitCode.INFRA
        finally:
            await sandbox.release()  # borrowed: disconnects only, the sandbox stays kept
        return ExitCode.OK

    return asyncio.run(attach())


def _raw(fd: int) -> Any:
    """The terminal in raw mode (keys go to the sandbox's shell as typed); its old state to restore."""
    import termios
    import tty

    if not os.isatty(fd):
        return None
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    return saved


def _restore(fd: int, saved: Any) -> None:
    import termios

    if saved is not None:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
