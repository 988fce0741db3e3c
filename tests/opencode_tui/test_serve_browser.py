"""`opencode-tui serve` in a real headless chromium (Debian's, driven by Playwright), against the real
server process on a loopback port. The live runs are real episodes: the scripted model on the local
(bubblewrap) provider.

What the page's terminal shows is read from what it was sent: the websocket's output frames are fed
to a terminal emulator (pyte) of the size the page asked for (xterm.js draws on a canvas, so the page
holds no text to read).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pyte
import pytest
import yaml

from opencode_tui.cli import main
from opencode_tui.serve_command import COOKIE

START_DEADLINE_S = 60.0
SCREEN_DEADLINE_S = 45.0
EPISODE_DEADLINE_S = 150.0  # a real episode: to its outcome, or to its confirmed close
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
REPO = Path(__file__).resolve().parents[2]


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.token = parse_qs(parts.query)["token"][0]


@pytest.fixture
def runs_dir(fixture_runs: Path, tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("oom", "hello-file"):
        shutil.copytree(fixture_runs / name, runs / name)
    return runs


@pytest.fixture
def serve(runs_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(*extra: str, runs: Path = runs_dir) -> Served:
        out = (tmp_path / f"serve-{len(started)}.out").open("w+")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "opencode_tui.cli",
                "serve",
                "--port",
                "0",
                "--runs-dir",
                str(runs),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)},
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + START_DEADLINE_S
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline().strip()
        assert line.startswith("http://127.0.0.1:"), f"serve printed {line!r}, exit {proc.poll()}"
        served = Served(proc, line.split()[0])
        started.append(served)
        return served

    yield start
    for s in started:
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(timeout=10)


class PageTerminal:
    """The screen of the page's terminal, rebuilt from the websocket frames it received."""

    def __init__(self, page) -> None:
        self.page = page
        self.screen: pyte.Screen | None = None
        self.stream: pyte.ByteStream | None = None
        page.on("websocket", self._socket)

    def _socket(self, ws) -> None:
        q = parse_qs(urlsplit(ws.url).query)
        self.screen = pyte.Screen(int(q["width"][0]), int(q["height"][0]))
        self.stream = pyte.ByteStream(self.screen)
        ws.on("framereceived", self._frame)

    def _frame(self, payload: bytes | str) -> None:
        if isinstance(payload, bytes) and self.stream is not None:
            self.stream.feed(payload)

    def text(self) -> str:
        return "\n".join(self.screen.display) if self.screen is not None else ""

    def wait_for(self, *needles: str, deadline_s: float = SCREEN_DEADLINE_S) -> str:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            self.page.wait_for_timeout(200)  # lets Playwright deliver the frames
            text = self.text()
            if all(n in text for n in needles):
                return text
        raise AssertionError(f"the page's terminal never showed {needles}; it shows:\n{self.text()}")

    def press(self, key: str) -> None:
        self.page.keyboard.press(key)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _ws_status(base: str, cookie: str | None, origin: str | None = None) -> int:
    """The HTTP status of a websocket handshake to /ws (101 when it opened)."""

    async def go() -> int:
        headers = {"Origin": origin} if origin else {}
        cookies = {COOKIE: cookie} if cookie else None
        async with aiohttp.ClientSession(cookies=cookies) as session:
            try:
                async with session.ws_connect(f"{base}/ws?width=80&height=24", headers=headers) as ws:
                    await ws.close()
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    # Playwright's sync API holds this thread's event loop: the client runs in a thread of its own.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result(timeout=30)


def _open(chromium_browser, served: Served):
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    term = PageTerminal(page)
    response = page.goto(served.url)
    assert response is not None and response.status == 200
    assert served.token not in page.url  # the token left the address bar for a cookie
    page.locator(".textual-terminal").click()
    return context, page, term


def test_serve_with_token_shows_the_runs_and_a_run_without_it_nothing(
    serve, chromium_browser, runs_dir: Path
) -> None:
    served = serve()
    # without the token: page, static files and websocket refused
    context = chromium_browser.new_context()
    page = context.new_page()
    assert page.goto(served.base + "/").status == 401
    assert page.goto(served.base + "/static/js/textual.js").status == 401
    assert page.goto(served.base + "/?token=not-the-token").status == 403
    opened = page.evaluate(
        """url => new Promise(done => { const ws = new WebSocket(url);
            ws.onopen = () => done('open'); ws.onerror = () => done('refused'); })""",
        served.base.replace("http", "ws") + "/ws?width=80&height=24",
    )
    assert opened == "refused"
    context.close()
    assert _ws_status(served.base, None) == 401
    assert _ws_status(served.base, "wrong") == 403
    assert _ws_status(served.base, served.token, origin="http://evil.example") == 403

    context, page, term = _open(chromium_browser, served)
    try:
        text = term.wait_for("Runs in", "provider_oom_killed", "hello-file")
        assert len(_children(served.proc.pid)) == 1  # the session's own app process
        assert "count_as_zero" in text and "scored" in text
        term.press("Enter")  # the newest run (oom) opens: its outcome
        term.wait_for("provider_oom_killed", "count_as_zero", "Cleanup receipt")
        term.press("s")  # not read-only: a replay has no shell, and nothing is refused
        page.wait_for_timeout(1500)
        assert "Read-only" not in term.text()
    finally:
        context.close()
    # the session's app process ends with its socket
    deadline = time.monotonic() + SCREEN_DEADLINE_S
    while _children(served.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _children(served.proc.pid) == []
    # the token is in no log line and no run directory
    served.proc.send_signal(signal.SIGTERM)
    out, _ = served.proc.communicate(timeout=20)
    logs = "".join(p.read_text() for p in runs_dir.parent.glob("serve-*.out")) + out
    assert served.token not in logs
    for f in runs_dir.rglob("*"):
        if f.is_file():
            assert served.token.encode() not in f.read_bytes(), f


def test_read_only_refuses_shell_and_rerun_and_sessions_are_limited(serve, chromium_browser) -> None:
    served = serve("--read-only", "--max-sessions", "1")
    context, _page, term = _open(chromium_browser, served)
    try:
        term.wait_for("Runs in", "provider_oom_killed")
        assert _ws_status(served.base, served.token) == 503  # the one session is taken
        term.press("r")
        term.wait_for("Read-only")
        term.press("Enter")
        term.wait_for("count_as_zero", "Cleanup receipt")
        term.press("s")
        term.wait_for("Read-only", "open shell is disabled")
    finally:
        context.close()


def test_port_in_use_is_one_line_and_exit_2(runs_dir: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--runs-dir", str(runs_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"127.0.0.1:{port} is in use" in err, err


def test_only_loopback_addresses_serve_without_a_warning() -> None:
    from opencode_tui.serve_command import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org"))


# -- live runs in a served session (a re-run from the runs browser) and a served batch --------------


def _task(tmp_path: Path, name: str) -> Path:
    task = tmp_path / name
    shutil.copytree(SAMPLES / "hello-file", task)
    spec = yaml.safe_load((task / "task.yaml").read_text())
    (task / "task.yaml").write_text(yaml.safe_dump({**spec, "id": name}))
    return task


def _make_busy(task: Path) -> None:
    """From now on its agent runs a two-minute command: a re-run of it is running when it is closed."""
    steps = [
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo started; sleep 120", "description": "Wait"}}
            ]
        },
        {"text": "done"},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))


def _first_run(task: Path, runs: Path) -> Path:
    """One real run of ``task`` (headless), the run the browser re-runs."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "opencode_tui.cli",
            "run",
            str(task),
            "--batch",
            "--provider",
            "local",
            "--runs-dir",
            str(runs),
        ],
        capture_output=True,
        text=True,
        timeout=EPISODE_DEADLINE_S,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


def _infos(runs: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in runs.glob("*/run.json")}


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + EPISODE_DEADLINE_S
    while _children(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _children(pid) == []


@pytest.mark.slow
@pytest.mark.bwrap
def test_a_rerun_in_the_served_browser_runs_live_and_closes_confirmed_with_its_socket(
    serve, chromium_browser, tmp_path: Path
) -> None:
    """`r` in the served runs browser runs the run again live in the same app (no second app): its
    outcome on the page, Esc back to the browser with both marked. A second re-run, busy, is running
    when the browser closes the session: the app gets SIGTERM and closes it, cleanup confirmed."""
    runs = tmp_path / "live-runs"
    task = _task(tmp_path, "served-hello")
    first = _first_run(task, runs)
    served = serve(runs=runs)
    context, _page, term = _open(chromium_browser, served)
    try:
        term.wait_for("Runs in", "served-hello")
        app_pid = _children(served.proc.pid)
        assert len(app_pid) == 1
        term.press("r")
        term.wait_for("LIVE", "served-hello")
        text = term.wait_for("scored", "Cleanup receipt", deadline_s=EPISODE_DEADLINE_S)
        assert "reward 1" in text or "scored" in text
        assert _children(served.proc.pid) == app_pid  # the same app process showed it
        (second,) = set(_infos(runs)) - {first.name}
        assert _infos(runs)[second]["counts"]["cleanup_confirmed"] is True
        term.press("Escape")  # back to the browser: the re-run and its original marked
        term.wait_for("Runs in", "re-run", "original")
        # the task turns busy; the re-run (under the cursor) is re-run, and left running
        _make_busy(task)
        term.press("r")
        term.wait_for("LIVE", "started", deadline_s=EPISODE_DEADLINE_S)
        (third,) = set(_infos(runs)) - {first.name, second}
    finally:
        context.close()  # the socket closes: the session's app gets SIGTERM
    _wait_gone(served.proc.pid)
    info = _infos(runs)[third]
    assert info["outcome"]["failure_kind"] == "run_cancelled", info["outcome"]
    assert info["counts"]["cancelled_by"] == "SIGTERM"
    assert info["counts"]["cleanup_confirmed"] is True
    assert served.proc.poll() is None  # the server goes on serving


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stopping_the_server_closes_a_served_live_run_with_cleanup_confirmed(
    serve, chromium_browser, tmp_path: Path, sig: signal.Signals
) -> None:
    """The server is stopped while a session runs a live re-run: that run is closed, cleanup confirmed
    and recorded, before the server exits."""
    runs = tmp_path / "live-runs"
    task = _task(tmp_path, "served-busy")
    first = _first_run(task, runs)
    _make_busy(task)
    served = serve(runs=runs)
    context, _page, term = _open(chromium_browser, served)
    try:
        term.wait_for("Runs in", "served-busy")
        term.press("r")
        term.wait_for("LIVE", "started", deadline_s=EPISODE_DEADLINE_S)
        served.proc.send_signal(sig)
        code = served.proc.wait(timeout=EPISODE_DEADLINE_S)
    finally:
        context.close()
    assert code == 0
    (second,) = set(_infos(runs)) - {first.name}
    info = _infos(runs)[second]
    assert info["outcome"]["failure_kind"] == "run_cancelled", info["outcome"]
    assert info["counts"]["cancelled_by"] == "SIGTERM"  # what the server sent the session's app
    assert info["counts"]["cleanup_confirmed"] is True


@pytest.mark.slow
@pytest.mark.bwrap
def test_a_served_batch_shows_its_rows_and_closes_with_its_socket(
    serve, chromium_browser, tmp_path: Path
) -> None:
    """`serve --run TASK TASK --jobs 2`: the session's app runs the batch on the batch screen, its rows
    and totals on the page (the batch id the one results.jsonl records); the browser closes while one
    attempt runs: it is closed with cleanup confirmed, and the app ends."""
    runs = tmp_path / "batch-runs"
    busy = _task(tmp_path, "served-busy")
    _make_busy(busy)
    served = serve("--run", "hello-file", str(busy), "--jobs", "2", "--provider", "local", runs=runs)
    context, _page, term = _open(chromium_browser, served)
    try:
        term.wait_for("BATCH", "hello-file", "served-busy", "running 2")
        text = term.wait_for("scored 1", "running 1", deadline_s=EPISODE_DEADLINE_S)
        assert "queued 0" in text
    finally:
        context.close()
    _wait_gone(served.proc.pid)
    results = [json.loads(line) for line in (runs / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in results) == ["hello-file", "served-busy"]
    (batch_id,) = {r["batch_id"] for r in results}
    assert f"BATCH {batch_id}" in text
    cancelled = next(r for r in results if r["task_id"] == "served-busy")
    assert cancelled["cancelled_by"] == "SIGTERM" and cancelled["cleanup_confirmed"] is True


def test_serve_run_refuses_read_only_and_a_missing_task(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    assert main(["serve", "--port", "0", "--runs-dir", str(runs), "--read-only", "--run", "hello-file"]) == 2
    assert main(["serve", "--port", "0", "--runs-dir", str(runs), "--run", str(tmp_path / "nosuch")]) == 2
    runs.mkdir()
    assert main(["serve", "--port", "0", "--runs-dir", str(runs), "--jobs", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "--read-only starts no runs" in err[0]
    assert any("nosuch" in line and "does not exist" in line for line in err)
    assert "--jobs and --provider are for --run" in err[-1]
