"""The provider contract suite: the behaviour every sandbox provider owes the engine.

Shipped in the package so a provider from another package can be checked without this repository:

    opencode-tui doctor --provider-contract NAME [--contract-image IMAGE] [--config FILE]

or with pytest directly (what that command runs; needs pytest and pytest-asyncio, the ``contract``
extra):

    python -m pytest -p opencode_tui_core.sandbox.contract.plugin --pyargs opencode_tui_core.sandbox.contract.suite \
        --contract-provider NAME

Tests needing a capability the provider does not declare are skipped, naming it (core/sandbox/contract/
plugin.py holds the fixtures, options and skips).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import os
import shutil
import socket
import socketserver
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from opencode_tui_core.inside.relay import RELAY_SCRIPT_PATH
from opencode_tui_core.sandbox.base import (
    LABEL_BATCH,
    SANDBOX_MODEL_SOCKET,
    OutputChunk,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxProvider,
    SandboxState,
    UnsafeArchiveError,
)
from opencode_tui_core.sandbox.tarsafe import directory_tar, safe_extract

pytestmark = pytest.mark.timeout(120)

MakeSandbox = Callable[..., Awaitable[Sandbox]]


# ------------------------------------------------------------------------------------------ basics


async def test_create_exec_release(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox(env={"GREETING": "hello"})
    assert sb.owned is True
    assert (await sb.status()).state is SandboxState.RUNNING

    result = await sb.exec(
        ["sh", "-c", 'pwd; echo "$GREETING $EXTRA"; echo oops >&2; exit 3'], env={"EXTRA": "x"}, timeout=30
    )
    assert result.observed is True
    assert result.exit_code == 3
    assert result.deadline_expired is False
    assert result.stdout == b"/app\nhello x\n"
    assert result.stderr == b"oops\n"

    other = await sb.exec(["pwd"], cwd="/tmp", timeout=30)
    assert other.ok and other.text() == "/tmp\n"

    await sb.release()
    await sb.release()  # idempotent
    with contextlib.suppress(SandboxClosedError):
        assert (await sb.status()).state is SandboxState.RELEASED


async def test_exec_streams_output_as_it_is_produced(sandbox: Sandbox) -> None:
    arrivals: list[tuple[float, OutputChunk]] = []
    start = time.monotonic()

    async def on_output(chunk: OutputChunk) -> None:  # a coroutine callback is awaited
        arrivals.append((time.monotonic() - start, chunk))

    result = await sandbox.exec(
        ["sh", "-c", "echo first; sleep 2; echo second"], timeout=30, on_output=on_output
    )
    total = time.monotonic() - start
    assert result.ok and result.stdout == b"first\nsecond\n"
    assert total >= 2.0
    first_at = next(t for t, c in arrivals if b"first" in c.data)
    second_at = next(t for t, c in arrivals if b"second" in c.data)
    # Streamed: the first chunk came a whole `sleep 2` before the second (the start's cost depends on load).
    assert second_at - first_at >= 1.5, f"first at {first_at:.2f}s, second at {second_at:.2f}s: not streamed"
    assert {c.execution_id for _, c in arrivals} == {result.execution_id}

    # A plain (non-async) callback works too, and stderr is told apart.
    seen: list[OutputChunk] = []
    await sandbox.exec(
        ["sh", "-c", "echo out; echo err >&2"], timeout=30, on_output=seen.append, execution_id="ex-fixed"
    )
    assert b"".join(c.data for c in seen if c.stream == "stdout") == b"out\n"
    assert b"".join(c.data for c in seen if c.stream == "stderr") == b"err\n"
    assert all(c.execution_id == "ex-fixed" for c in seen)


async def test_exec_stdin(sandbox: Sandbox) -> None:
    payload = os.urandom(200_000)
    result = await sandbox.exec(["sha256sum"], stdin=payload, timeout=30)
    import hashlib

    assert result.ok
    assert result.text().split()[0] == hashlib.sha256(payload).hexdigest()
    empty = await sandbox.exec(["cat"], stdin=b"", timeout=30)
    assert empty.ok and empty.stdout == b""


async def test_exec_past_its_deadline_is_unobserved_not_124(sandbox: Sandbox) -> None:
    start = time.monotonic()
    result = await sandbox.exec(["sleep", "30"], timeout=1.0)
    elapsed = time.monotonic() - start
    assert elapsed < 4.0, f"exec overran its deadline: {elapsed:.1f}s"
    assert result.exit_code is None
    assert result.observed is False
    assert result.deadline_expired is True
    assert result.exit_code != 124
    # The sandbox stays usable.
    assert (await sandbox.exec(["true"], timeout=30)).ok


@pytest.mark.parametrize(
    ("argv", "timeout", "says"),
    [
        ([], 30, "argv must not be empty"),
        (["true"], 0, "timeout must be a finite number > 0"),
        (["true"], float("inf"), "timeout must be a finite number > 0"),
    ],
)
async def test_exec_refuses_bad_arguments_and_stays_usable(sandbox: Sandbox, argv, timeout, says) -> None:
    with pytest.raises(ValueError, match=says):
        await sandbox.exec(argv, timeout=timeout)
    assert (await sandbox.exec(["true"], timeout=30)).ok


# ------------------------------------------------------------------------------------------- files


async def test_upload_download_file_round_trip(sandbox: Sandbox) -> None:
    data = os.urandom(70_000)
    await sandbox.upload_file("/app/deep/er/blob.bin", data, mode=0o600)
    assert await sandbox.download_file("/app/deep/er/blob.bin") == data
    mode = await sandbox.exec(["stat", "-c", "%a", "/app/deep/er/blob.bin"], timeout=30)
    assert mode.text().strip() == "600"
    with pytest.raises((FileNotFoundError, SandboxError)):
        await sandbox.download_tar("/app/no/such/file")


async def test_uploads_drop_setuid_setgid_and_sticky(sandbox: Sandbox) -> None:
    """An uploaded setuid/setgid file must not keep those bits inside (the engine writes as root: a
    setuid-root file would be a way up for a non-root sandbox user), whether it comes by archive or
    by ``upload_file``."""
    from opencode_tui_core.sandbox.tarsafe import tree_tar

    archive = tree_tar({"suid": (b"#!/bin/sh\n", 0o4755), "sgid": (b"x", 0o2755), "dir": (None, 0o1777)})
    await sandbox.upload_tar("/app/modes", archive)
    await sandbox.upload_file("/app/modes/direct", b"#!/bin/sh\n", 0o6755)
    r = await sandbox.exec(
        ["/bin/sh", "-c", "cd /app/modes && stat -c '%n %a' suid sgid dir direct"], timeout=30
    )
    assert r.ok, r.stderr
    modes = dict(line.split() for line in r.stdout.decode().splitlines())
    # Only the special bits go (the local provider also drops group/other write, so "dir" differs).
    assert {k: modes[k] for k in ("suid", "sgid", "direct")} == {
        "suid": "755",
        "sgid": "755",
        "direct": "755",
    }
    assert int(modes["dir"], 8) & 0o7000 == 0


async def test_upload_download_directory_round_trip(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "proj"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "README.md").write_text("# proj\n")
    (src / "pkg" / "mod.py").write_text("print('hi')\n")
    (src / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(5000))
    (src / "pkg" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (src / "pkg" / "run.sh").chmod(0o755)
    (src / "pkg" / "link.py").symlink_to("mod.py")

    await sandbox.upload_tar("/app/proj", directory_tar(src))
    ran = await sandbox.exec(["sh", "-c", "./pkg/run.sh && cat pkg/link.py"], cwd="/app/proj", timeout=30)
    assert ran.ok and ran.text() == "run\nprint('hi')\n"

    archive = await sandbox.download_tar("/app/proj")
    out = tmp_path / "out"
    safe_extract(archive, out)
    back = out / "proj"
    for rel in ["README.md", "pkg/mod.py", "pkg/sub/data.bin", "pkg/run.sh"]:
        assert (back / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert os.readlink(back / "pkg" / "link.py") == "mod.py"
    assert os.access(back / "pkg" / "run.sh", os.X_OK)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def _file(name: str, data: bytes = b"pwned\n") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info, None


def _device(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3
    return info, None


ESC = f"escaped-{uuid.uuid4().hex[:8]}"
_Member = tuple[tarfile.TarInfo, bytes | None]
UNSAFE_ARCHIVES: dict[str, tuple[list[_Member], str]] = {
    "dotdot": ([_file(f"../{ESC}")], "'..'"),
    "absolute": ([_file(f"/etc/{ESC}")], "absolute"),
    "symlink-to-root": ([_link("root", "/"), _file(f"root/etc/{ESC}")], "symlink"),
    "symlink-escaping": ([_link("up", "../.."), _file(f"up/{ESC}")], "symlink"),
    "device": ([_device(f"null-{ESC}")], "device"),
    "chained-symlinks": ([_link("a", "."), _link("a/b", ".."), _file(f"a/b/{ESC}")], "symlink"),
}


@pytest.mark.parametrize("case", list(UNSAFE_ARCHIVES))
async def test_unsafe_archives_are_refused_and_nothing_is_written(sandbox: Sandbox, case: str) -> None:
    members, words = UNSAFE_ARCHIVES[case]
    archive = _tar(*members)
    with pytest.raises(UnsafeArchiveError, match=words) as info:
        await sandbox.upload_tar("/app/target", archive)
    assert "archive member" in str(info.value)  # the message names the offending member
    check = await sandbox.exec(
        [
            "sh",
            "-c",
            f"for p in /{ESC} /etc/{ESC} /app/{ESC} /app/target/{ESC} /app/target/null-{ESC}; do "
            '[ -e "$p" ] && echo "written: $p"; done; '
            '[ -d /app/target ] && [ -n "$(ls -A /app/target)" ] && echo "target not empty"; true',
        ],
        timeout=30,
    )
    assert check.ok and check.stdout == b"", check.text()


# ------------------------------------------------------------------------------------- after close


async def test_operations_after_release_are_refused(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox()
    await sb.release()
    with pytest.raises(SandboxClosedError):
        await sb.exec(["true"], timeout=10)
    with pytest.raises(SandboxClosedError):
        await sb.upload_file("/app/x", b"x")
    with pytest.raises(SandboxClosedError):
        await sb.download_tar("/app")
    with pytest.raises(SandboxClosedError):
        await sb.pty(["bash"])
    with pytest.raises(SandboxClosedError):
        await sb.inspect()
    await sb.release()


async def test_a_hurried_second_release_waits_for_the_first_even_when_it_is_cancelled(
    provider: SandboxProvider, make_sandbox: MakeSandbox
) -> None:
    """A hurried close calls release while the episode's own release runs, and cancels that one:
    the second call returns only once the sandbox is gone (one removal in flight, not cut short).
    The batch label rides on the provider's own labels (what `sweep --batch` finds)."""
    batch = f"b-{uuid.uuid4().hex[:8]}"
    sb = await make_sandbox(labels={LABEL_BATCH: batch})
    listed = {r.sandbox_id: r.labels for r in await provider.listed()}
    assert listed[sb.sandbox_id][LABEL_BATCH] == batch
    first = asyncio.ensure_future(sb.release())
    await asyncio.sleep(0)  # the first release is under way (its removal has started, not ended)
    second = asyncio.ensure_future(sb.release())
    await asyncio.sleep(0)
    assert not first.done()
    first.cancel()
    await asyncio.wait_for(second, 60)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert sb.sandbox_id not in {r.sandbox_id for r in await provider.listed()}
    await asyncio.wait_for(sb.release(), 1)  # released: at once


# ---------------------------------------------------------------------------------------- network


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _ModelHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from the host model socket: {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def model_socket() -> Iterator[str]:
    """A real HTTP server on a host Unix socket (short path: AF_UNIX paths are limited)."""
    tmp = tempfile.mkdtemp(prefix="oct-", dir="/tmp")
    path = os.path.join(tmp, "model.sock")
    server = _UnixHTTPServer(path, _ModelHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP port listening on the host's loopback."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close()\n"
    "except OSError as exc:\n"
    "    print('refused:', exc); sys.exit(1)\n"
    "print('connected')\n"
)
FETCH = "import sys, urllib.request\nprint(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"


@pytest.mark.requires("model_socket")
async def test_model_only_network_reaches_the_model_socket_only(
    make_sandbox: MakeSandbox, model_socket: str, host_listener: int
) -> None:
    sb = await make_sandbox(model_socket=model_socket)

    # The host's loopback is not reachable from inside.
    blocked = await sb.exec(["python3", "-c", CONNECT, str(host_listener)], timeout=30)
    assert blocked.observed and blocked.exit_code == 1, blocked.text()

    # The relay forwards loopback TCP inside the sandbox to the bound model socket.
    await sb.upload_file("/tmp/relay.py", RELAY_SCRIPT_PATH.read_bytes(), mode=0o755)
    started = await sb.exec(
        [
            "sh",
            "-c",
            f"python3 /tmp/relay.py 0 {SANDBOX_MODEL_SOCKET} >/tmp/relay.port 2>/tmp/relay.err </dev/null &",
        ],
        timeout=30,
    )
    assert started.ok, started.stderr
    port = ""
    for _ in range(100):
        port = (await sb.exec(["cat", "/tmp/relay.port"], timeout=10)).text().strip()
        if port:
            break
        await asyncio.sleep(0.1)
    assert port.isdigit(), "the relay did not print its port"

    fetched = await sb.exec(["python3", "-c", FETCH, f"http://127.0.0.1:{port}/v1/models"], timeout=30)
    assert fetched.ok, fetched.stderr.decode()
    assert fetched.text().strip() == "hello from the host model socket: /v1/models"
    again = await sb.exec(["python3", "-c", FETCH, f"http://127.0.0.1:{port}/again"], timeout=30)
    assert again.ok and "/again" in again.text()


# -------------------------------------------------------------------------------------------- pty


async def _read_until(pty: object, needle: bytes, timeout: float = 10.0) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{needle!r} never appeared; got {buf[-500:]!r}"
        chunk = await asyncio.wait_for(pty.read(), remaining)  # type: ignore[attr-defined]
        assert chunk, f"the terminal closed before {needle!r} appeared; got {buf[-500:]!r}"
        buf += chunk
    return buf


@pytest.mark.requires("pty")
async def test_pty_interactive_shell(sandbox: Sandbox) -> None:
    pty = await sandbox.pty(["bash", "--norc", "--noprofile", "-i"], cols=100, rows=30)
    try:
        await pty.write(b"echo h''i\n")  # the echoed input does not contain "hi", only the output does
        await _read_until(pty, b"hi\r\n")
        await pty.write(b"stty size\n")
        await _read_until(pty, b"30 100")
        await pty.resize(132, 43)
        await pty.write(b"stty size\n")
        await _read_until(pty, b"43 132")
    finally:
        await pty.close()
    await pty.close()  # idempotent
    for _ in range(100):  # at most some already-buffered output, then the end
        if await asyncio.wait_for(pty.read(), 5) == b"":
            break
    else:
        pytest.fail("read() kept returning data after close()")


# ------------------------------------------------------------------------------------ sandbox user


@pytest.mark.requires("users")
async def test_the_spec_user_runs_everything_and_owned_uploads_are_its(make_sandbox: MakeSandbox) -> None:
    """``SandboxSpec.user`` is who every exec and terminal runs as, and an archive's owners and modes
    (its ``.`` entry: the target directory itself) apply whoever extracts it. The archive is made under
    umask 077 on the controller: nothing here may depend on it."""
    from opencode_tui_core.sandbox.tarsafe import tree_tar

    sb = await make_sandbox(user="1000:1000")
    user = await sb.identify()
    assert (user.uid, user.gid) == (1000, 1000)
    old = os.umask(0o077)
    try:
        archive = tree_tar(
            {"in.txt": (b"input\n", 0o600), "home": (None, 0o700)}, owner=user.ids, root_mode=0o700
        )
    finally:
        os.umask(old)
    await sb.upload_tar("/tmp/owned-session", archive)
    r = await sb.exec(
        [
            "sh",
            "-c",
            "stat -c '%a %u:%g' /tmp/owned-session /tmp/owned-session/in.txt /tmp/owned-session/home "
            "&& cat /tmp/owned-session/in.txt && id -u",
        ],
        timeout=30,
    )
    assert r.ok, r.stderr
    assert r.text().splitlines() == ["700 1000:1000", "600 1000:1000", "700 1000:1000", "input", "1000"]
    pty = await sb.pty(["sh", "-c", "echo PTY=$(id -u)=; sleep 5"])
    try:
        seen = b""
        async with asyncio.timeout(20):
            while b"=" not in seen.partition(b"PTY=")[2]:
                chunk = await pty.read()
                if not chunk:
                    break
                seen += chunk
        assert b"PTY=1000=" in seen
    finally:
        await pty.close()
