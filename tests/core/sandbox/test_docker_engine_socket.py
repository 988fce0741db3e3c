"""The Docker sandbox's two ways to the engine give the same results: straight over its Unix socket
from the event loop (opencode_tui_core.sandbox.docker.engine_socket, the default) and through the SDK in threads
(an engine reached over tcp). The tcp engine here is the real one behind a loopback relay to its
socket, so both runs talk to the same dockerd."""

from __future__ import annotations

import contextlib
import io
import socket
import socketserver
import tarfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import docker.errors
import pytest

from opencode_tui_core.failures import Delivery
from opencode_tui_core.sandbox.base import SandboxError, SandboxSpec
from opencode_tui_core.sandbox.docker.engine_socket import EngineNotFound, EngineSocket
from opencode_tui_core.sandbox.docker.oom_rules import SOURCE_EVENTS, SOURCE_STATE
from opencode_tui_core.sandbox.docker.provider import DockerProvider, DockerSandbox

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]
DOCKER_SOCKET = "/var/run/docker.sock"


class _Relay(socketserver.ThreadingTCPServer):
    """127.0.0.1:<port> → the engine's Unix socket, byte for byte."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Pipe)


class _Pipe(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(DOCKER_SOCKET)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
        back.start()
        pump(self.request, upstream)
        back.join(30)
        upstream.close()


@pytest.fixture
def tcp_engine(docker_client: Any) -> Iterator[str]:
    relay = _Relay()
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{relay.server_address[1]}"
    finally:
        relay.shutdown()
        relay.server_close()


@pytest.fixture(params=["socket", "sdk"])
async def sandbox(
    request: pytest.FixtureRequest, docker_client: Any, spec_factory: Callable[..., SandboxSpec]
) -> AsyncIterator[DockerSandbox]:
    base_url = request.getfixturevalue("tcp_engine") if request.param == "sdk" else None
    sb = await DockerProvider(base_url=base_url).create(spec_factory())
    assert (sb._engine is None) == (request.param == "sdk")
    try:
        yield sb
    finally:
        await sb.release()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(sb.sandbox_id)


def _tar(name: str, data: bytes, mode: int = 0o640) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.uid, info.gid = len(data), mode, 1000, 1000
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_execs_and_files_give_the_same_results_either_way(sandbox: DockerSandbox) -> None:
    """stdin, both streams, the exit code, env, cwd and user; a deadline that expires; an upload
    into a directory that does not exist yet (refused with 404, made, put again) read back; a
    download of a missing path; the inspect and events the close reads; the removal (the fixture's
    release, which fails the test if it does not confirm)."""
    r = await sandbox.exec(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"in\n" * 5000, timeout=30)
    assert (r.exit_code, r.observed, r.stdout, r.stderr) == (3, True, b"in\n" * 5000, b"err\n")
    r = await sandbox.exec(
        ["sh", "-c", 'echo "$X $(pwd) $(id -u)"'], env={"X": "y z"}, cwd="/tmp", user="0", timeout=30
    )
    assert r.ok and r.stdout == b"y z /tmp 0\n"
    r = await sandbox.exec(["sleep", "30"], timeout=1.5)
    assert r.deadline_expired and r.exit_code is None and not r.observed
    await sandbox.upload_tar("/srv/new dir/deeper", _tar("a.txt", b"hello"))
    with tarfile.open(fileobj=io.BytesIO(await sandbox.download_tar("/srv/new dir/deeper/a.txt"))) as tar:
        [member] = tar.getmembers()
        got = tar.extractfile(member)
        assert got is not None and got.read() == b"hello"
        assert (member.mode & 0o777, member.uid, member.gid) == (0o640, 1000, 1000)
    with pytest.raises(FileNotFoundError):
        await sandbox.download_tar("/no/such/path")
    # The engine's state and events, as the close reads them (the events' window is the sandbox's life).
    evidence = {e.source: e.data for e in await sandbox.inspect()}
    assert evidence[SOURCE_STATE]["exists"] is True and evidence[SOURCE_STATE]["Running"] is True
    assert "error" not in evidence[SOURCE_EVENTS], evidence[SOURCE_EVENTS]


async def test_an_exec_in_a_removed_container_is_lost_and_not_sent(
    sandbox: DockerSandbox, docker_client: Any
) -> None:
    docker_client.api.remove_container(sandbox.sandbox_id, force=True)
    with pytest.raises(SandboxError) as info:
        await sandbox.exec(["true"], timeout=10)
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_lost" and failure.http_status == 404
    assert failure.details is not None and failure.details.delivery is Delivery.NOT_SENT  # type: ignore[union-attr]


async def test_the_socket_answers_in_the_sdks_error_types(docker_client: Any) -> None:
    """A 404 is the SDK's NotFound (what the provider catches), with the engine's own message."""
    engine = EngineSocket.of(docker_client)
    assert engine is not None and engine.path == DOCKER_SOCKET
    with pytest.raises(EngineNotFound) as info:
        await engine.call("GET", "/containers/opencode-tui-no-such-container/json")
    assert isinstance(info.value, docker.errors.NotFound) and info.value.status_code == 404
    assert "no such container" in str(info.value).lower()
    version = await engine.call("GET", "/version")
    assert version["ApiVersion"]
