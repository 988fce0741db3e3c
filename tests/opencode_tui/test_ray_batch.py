"""`opencode-tui run --batch --executor ray` against a real local Ray head.

The head is started here (``ray start --head --block`` bound to 127.0.0.1, two CPUs: two worker
processes, no dashboard, no usage stats) with this tree first on its workers' path; the driver is the
real CLI in a subprocess. Episodes use the local provider (bubblewrap) and the embedded scripted model.
Faults are real: a worker process is SIGKILLed mid-episode, the driver gets a real SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.failures import FailureEvent, FailureStage, decide, is_registered
from opencode_tui_core.sandbox.providers import get_provider
from tests.ray_cluster import RayHead, RayNode

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_tasks"
CLI = [sys.executable, "-m", "opencode_tui.cli"]
# What must match between the executors, per task (run ids, sandbox ids, timings and token counts of
# the scripted model's title call differ run to run, and so does the number of tool calls of `oom`:
# whether OpenCode survives the kernel's OOM kill to make its next call varies, on either executor).
SAME = (
    "task_id",
    "attempt",
    "provider",
    "reward",
    "action",
    "failure_kind",
    "failure_stage",
    "failure_class",
    "cleanup_confirmed",
    "cleanup_proof",
    "cancelled_by",
    "exit_code",
    "started",
    "resumed",
    "human_intervened",
    "sandbox_kept",
)

pytestmark = [pytest.mark.slow, pytest.mark.bwrap, pytest.mark.ray]


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead(cpus=2)
    try:
        yield head
    finally:
        head.stop()


def _task(tmp_path: Path, name: str, new_id: str | None = None, **changes) -> Path:
    dest = tmp_path / "tasks" / (new_id or name)
    shutil.copytree(SAMPLES / name, dest)
    data = yaml.safe_load((dest / "task.yaml").read_text())
    if new_id:
        data["id"] = new_id
    data.update(changes)
    (dest / "task.yaml").write_text(yaml.safe_dump(data))
    return dest


def _busy_task(tmp_path: Path, new_id: str, seconds: int) -> Path:
    """hello-file whose agent first runs ``sleep SECONDS`` (keeps the agent phase busy)."""
    dest = _task(tmp_path, "hello-file", new_id)
    trajectory = yaml.safe_load((dest / "trajectory.yaml").read_text())
    sleep = {"name": "bash", "arguments": {"command": f"sleep {seconds}", "description": "wait"}}
    trajectory["steps"].insert(0, {"tool_calls": [sleep]})
    (dest / "trajectory.yaml").write_text(yaml.safe_dump(trajectory))
    return dest


def _run(*args: str, timeout: float = 400, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "run", *args], capture_output=True, text=True, timeout=timeout, env=env)


def _ray_cli(head: RayHead, runs: Path) -> list[str]:
    """``opencode-tui run --batch`` on ``head`` with the local provider (tasks go after it)."""
    return [*CLI, "run", *_ray_args(head, runs)]


def _ray_args(head: RayHead, runs: Path) -> list[str]:
    return [
        "--batch",
        "--provider",
        "local",
        "--executor",
        "ray",
        "--ray-address",
        head.address,
        "--runs-dir",
        str(runs),
    ]


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]  # every stdout line is a JSON line


def _our_sandboxes(owner: str) -> list[str]:
    records = asyncio.run(get_provider("local").listed(owner=owner))
    return [r.sandbox_id for r in records]


def _labels(owner: str) -> dict[str, dict[str, str]]:
    return {r.sandbox_id: r.labels for r in asyncio.run(get_provider("local").listed(owner=owner))}


# A process that creates a local sandbox with these labels, keeps it and exits: a leftover whose
# creating process is gone, as a lost worker of another batch would leave it.
_LEFTOVER = """
import asyncio, sys
from opencode_tui_core.sandbox.base import LABEL_BATCH, SandboxSpec
from opencode_tui_core.sandbox.local.provider import LocalProvider

async def main():
    spec = SandboxSpec(run_id=sys.argv[1], labels={LABEL_BATCH: sys.argv[2]})
    sandbox = await LocalProvider().create(spec)
    await sandbox.keep()
    print(sandbox.sandbox_id)

asyncio.run(main())
"""


def _leftover(run_id: str, batch_id: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", _LEFTOVER, run_id, batch_id],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _wait_agent_phase(runs: Path, proc: subprocess.Popen, n: int, timeout: float = 240) -> list[dict]:
    """run.json of ``n`` attempts that reached the agent phase (their OpenCode is running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        infos = []
        for path in runs.glob("*/run.json"):
            try:
                info = json.loads(path.read_text())
            except ValueError:
                continue  # being rewritten
            if info["phase"] == "agent" and info["outcome"] is None:
                infos.append(info)
        if len(infos) >= n:
            return infos
        time.sleep(0.2)
    raise AssertionError(f"{n} attempt(s) never reached the agent phase")


# ---- the new failure kind ---------------------------------------------------------------------


def test_worker_lost_is_registered_and_retried_then_an_evaluation_error():
    assert is_registered("executor_worker_lost")
    failure = FailureEvent(
        kind="executor_worker_lost", stage=FailureStage.AGENT, operation="agent phase", message="lost"
    )
    assert decide(failure, attempt=1).action == "retry"
    last = decide(failure, attempt=3)  # the default max_attempts
    assert last.action == "mark_evaluation_error" and last.failure_class == "evaluation"


def test_executor_ray_needs_a_batch(tmp_path):
    r = _run(str(SAMPLES / "hello-file"), "--executor", "ray", "--runs-dir", str(tmp_path / "runs"))
    assert r.returncode == 2 and "--executor ray runs batches only (--batch, or several tasks" in r.stderr
    assert r.stdout == "" and not (tmp_path / "runs").exists()


# ---- same outcomes and JSON lines as the local executor ---------------------------------------


def test_ray_batch_matches_the_local_executor(ray_head, tmp_path, test_owner):
    tasks = [str(_task(tmp_path, "hello-file", f"hello-{i}")) for i in range(1, 5)]
    tasks += [str(SAMPLES / "oom"), str(SAMPLES / "model-flaky-500")]
    common = ["--batch", "--provider", "local"]

    local = _run(*tasks, *common, "--jobs", "2", "--runs-dir", str(tmp_path / "local"))
    # Through the config file, as a user would keep it; the flag overrides nothing here.
    config = tmp_path / "ray.yaml"
    config.write_text(yaml.safe_dump({"executor": {"name": "ray", "ray": {"address": ray_head.address}}}))
    on_ray = _run(
        *tasks, *common, "--config", str(config), "--runs-dir", str(tmp_path / "ray"), env=ray_head.env
    )

    assert local.returncode == on_ray.returncode == 3, (local.stderr, on_ray.stderr)
    a, b = _lines(local.stdout), _lines(on_ray.stdout)
    assert len(a) == len(b) == 6
    assert all(set(x) == set(a[0]) for x in a + b)  # the same JSON line schema
    by_task_a = {x["task_id"]: {k: x[k] for k in SAME} for x in a}
    by_task_b = {x["task_id"]: {k: x[k] for k in SAME} for x in b}
    for task_id, fields in by_task_a.items():
        assert by_task_b[task_id] == fields, (task_id, by_task_b[task_id], fields)
    hello = sorted(
        (x["task_id"], x["tool_calls"], x["model_calls"]) for x in a if x["task_id"].startswith("hello")
    )
    assert hello == sorted(
        (x["task_id"], x["tool_calls"], x["model_calls"]) for x in b if x["task_id"].startswith("hello")
    )
    assert {k: by_task_b[k]["action"] for k in by_task_b} == {
        **{f"hello-{i}": "scored" for i in range(1, 5)},
        "oom": "count_as_zero",
        "model-flaky-500": "mark_evaluation_error",
    }
    flaky = next(x for x in b if x["task_id"] == "model-flaky-500")
    assert flaky["attempt"] == 3 and len(flaky["previous_attempts"]) == 2  # retried by policy, on Ray
    assert all(Path(p, "events.jsonl").is_file() for p in flaky["previous_attempts"])
    # The summary line is the local executor's.
    assert local.stderr.splitlines()[-1] == on_ray.stderr.splitlines()[-1]
    assert on_ray.stderr.splitlines()[-1].startswith(  # (then the health warnings, the same on both)
        "opencode-tui: 5 of 6 scored (1 as zero: provider_oom_killed x1); 1 failed: model_server_error x1"
    )
    # results.jsonl as the local executor writes it: one line per finished episode.
    recorded = [json.loads(line) for line in (tmp_path / "ray" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in recorded) == sorted(x["task_id"] for x in b)
    # Run directories were written by the workers into the shared runs directory: 8 attempts.
    assert len(list((tmp_path / "ray").glob("*/run.json"))) == 8
    assert not list((tmp_path / "ray").glob(".ray-probe-*"))  # the probe is removed at the end
    assert _our_sandboxes(test_owner) == []

    # Resume is the local executor's, across executors too: the batch run here resumes on Ray (the
    # same configuration but for the executor), skipping what scored and running the rest again as
    # the next attempts.
    again = _run(
        *tasks,
        *common,
        *("--config", str(config), "--runs-dir", str(tmp_path / "local")),
        env=ray_head.env,
    )
    lines = _lines(again.stdout)
    assert sorted(x["task_id"] for x in lines if x["resumed"]) == sorted(
        [f"hello-{i}" for i in range(1, 5)] + ["oom"]
    )
    rerun = next(x for x in lines if x["task_id"] == "model-flaky-500")
    # The policy bounds retries by the attempt number: attempt 4 is past max_attempts, its failure is final.
    assert not rerun["resumed"] and rerun["attempt"] == 4 and rerun["action"] == "mark_evaluation_error"
    assert len(rerun["previous_attempts"]) == 3  # the local batch's three attempts
    assert _our_sandboxes(test_owner) == []


def test_batch_warm_on_ray_is_said_to_be_ignored_and_why(ray_head, tmp_path, test_owner):
    """batch.warm asks for sandboxes prepared ahead; the Ray executor prepares none and says so as
    the batch starts (stderr), in the summary line, in the batch's record and in doctor."""
    tasks = [str(_task(tmp_path, "hello-file", f"hello-{i}")) for i in range(1, 3)]
    config = tmp_path / "ray.yaml"
    config.write_text(yaml.safe_dump({"batch": {"warm": 2}, "policy": {"max_attempts": 1}}))
    runs = tmp_path / "runs"
    r = subprocess.run(
        [*_ray_cli(ray_head, runs), *tasks, "--jobs", "1", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=400,
        env=ray_head.env,
    )
    assert r.returncode == 0, r.stderr
    assert all(line["action"] == "scored" and not line["warm"] for line in _lines(r.stdout))
    said = "warm-ahead not used: batch.warm: 2 is ignored by the ray executor: each attempt runs as a"
    err = r.stderr.splitlines()
    warned = [i for i, line in enumerate(err) if line.startswith(f"opencode-tui run: warning: {said}")]
    batch_line = next(i for i, line in enumerate(err) if line.startswith("opencode-tui: batch "))
    assert warned and warned[0] < batch_line, r.stderr  # as the batch starts, before its end
    assert err[-1].startswith(f"opencode-tui: 2 of 2 scored; {said}"), err[-1]
    assert "every attempt creates its own sandbox" in err[-1]

    end = [json.loads(line) for line in (runs / "batches.jsonl").read_text().splitlines()][-1]
    assert end["executor"] == "ray" and end["ended_at"] and end["warm"] is None and end["warm_depth"] == 0
    assert end["warm_not_used"].startswith("batch.warm: 2 is ignored by the ray executor")
    doctor = subprocess.run(
        [*CLI, "doctor", "--json", "--runs-dir", str(runs)], capture_output=True, text=True, timeout=180
    )
    [warm] = [c for c in map(json.loads, doctor.stdout.splitlines()) if c["name"] == "warm pool"]
    assert warm["status"] == "warn" and f"{said}" in warm["detail"], warm
    assert _our_sandboxes(test_owner) == []


def test_the_providers_checks_run_on_a_node_before_anything_starts(ray_head, tmp_path):
    """With Ray the sandboxes live on the nodes: the provider's admission checks (here Docker's: the
    image exists on the node's engine) run there, in the probe; a failure is one line, exit 2."""
    task = _task(tmp_path, "hello-file", image="opencode-tui/no-such-image:latest")
    runs = tmp_path / "runs"
    args = ["--batch", "--provider", "docker", "--executor", "ray", "--ray-address", ray_head.address]
    r = _run(*args, "--runs-dir", str(runs), str(task), env=ray_head.env)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("opencode-tui")]
    assert len(errors) == 1, r.stderr
    # The node as the cluster knows it (the address it registered), then the provider's own words.
    assert re.match(r"opencode-tui run: Ray node [0-9.]+ cannot run this batch: image ", errors[0])
    assert "opencode-tui/no-such-image:latest" in errors[0]
    assert list(runs.iterdir()) == []  # nothing started: no run, no results.jsonl, the probe removed


def test_a_terminal_shows_each_attempts_live_phase_on_ray(ray_head, tmp_path):
    """On a terminal (stderr a real pty) the progress row of an attempt on a Ray worker shows the phase
    its worker reports, not only "on Ray"."""
    import fcntl
    import struct
    import termios
    import threading

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(
        [*_ray_cli(ray_head, tmp_path / "runs"), str(_task(tmp_path, "hello-file"))],
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
        env={**ray_head.env, "TERM": "xterm-256color", "COLUMNS": "200"},
    )
    os.close(slave)
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the pty's other end closed
                return
            if not data:
                return
            seen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
        os.close(master)
    assert proc.returncode == 0
    assert _lines(out)[0]["action"] == "scored"
    text = seen.decode("utf-8", "replace")
    phases = set(re.findall(r"hello-file a1: (\w+) on Ray", text))
    assert "agent" in phases and len(phases) >= 3, text[-3000:]


# ---- a worker lost mid-episode ---------------------------------------------------------------


def test_a_killed_worker_is_worker_lost_swept_by_batch_and_run_and_retried(ray_head, tmp_path, test_owner):
    """The lost attempt's sandbox carries the batch id; the sweep on its node removes exactly it, not
    a leftover of another batch that carries the same run id (its creator gone too); `sweep --batch`
    then removes that one by its own batch id."""
    task = _busy_task(tmp_path, "busy", seconds=8)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [*_ray_cli(ray_head, runs), str(task), "--attempts", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ray_head.env,
    )
    try:
        (info,) = _wait_agent_phase(runs, proc, 1)
        batch = info["batch_id"]
        assert re.fullmatch(r"b[0-9a-f]{11}", batch)
        worker = int(info["controller"].split(".")[2])  # the process that runs the episode
        assert Path(f"/proc/{worker}/cmdline").read_bytes().startswith(b"ray::")
        labels = _labels(test_owner)[info["sandbox_id"]]
        assert labels["opencode-tui.batch"] == batch and labels["opencode-tui.run"] == info["run_id"]
        other = _leftover(info["run_id"], "b-other-batch")
        time.sleep(1.0)  # OpenCode is inside its `sleep 8`
        os.kill(worker, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        assert proc.returncode == 0, err
        (line,) = _lines(out)
        assert line["attempt"] == 2 and line["action"] == "scored" and line["cleanup_confirmed"] is True
        assert line["batch_id"] == batch and f"opencode-tui: batch {batch}" in err.splitlines()
        lost_dir = info["run_id"]
        assert line["previous_attempts"] == [str(runs / lost_dir)]
        lost = json.loads((runs / lost_dir / "run.json").read_text())
        assert lost["batch_id"] == batch
        assert lost["outcome"]["failure_kind"] == "executor_worker_lost"
        assert lost["outcome"]["failure_stage"] == "agent" and lost["outcome"]["action"] == "retry"
        assert re.search(rf"the Ray worker \(pid {worker}\) on node [0-9.]+ ", lost["outcome"]["summary"])
        assert info["sandbox_id"] in lost["outcome"]["summary"]  # swept by name
        assert other not in lost["outcome"]["summary"]
        assert lost["counts"]["cleanup_confirmed"] is True and lost["counts"]["cleanup_proof"] == "destroyed"
        # Only the other batch's leftover is left; nothing of this batch.
        assert _our_sandboxes(test_owner) == [other]
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=10).stdout
        assert info["sandbox_id"] not in ps  # nothing of the lost sandbox still runs
        mine = subprocess.run(
            [*CLI, "sweep", "--provider", "local", "--batch", batch],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert mine.returncode == 2 and f"no sandbox of ours carries batch {batch!r}" in mine.stderr
    finally:
        swept = subprocess.run(
            [*CLI, "sweep", "--provider", "local", "--batch", "b-other-batch"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert swept.returncode == 0, swept.stderr
    assert _lines(swept.stdout) == [
        {"provider": "local", "sandbox_id": other, "action": "removed", "batch_id": "b-other-batch"}
    ]
    assert _our_sandboxes(test_owner) == []


def test_a_lost_node_is_swept_when_it_comes_back_by_the_next_task_there(tmp_path, test_owner):
    """A whole node is lost mid-episode (its raylet and workers SIGKILLed): its sandbox cannot be swept
    then; a node at the same address comes back, and the retry that lands there sweeps the lost
    attempt's sandbox (batch id + run id) before its own episode; another batch's leftover with the
    same run id stays. The head has no CPU, so episodes run on the worker nodes only."""
    # The head notices a dead node within seconds (Ray's health check; its defaults take ~30 s).
    fast = {
        "RAY_health_check_initial_delay_ms": "1000",
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }
    head = RayHead(cpus=0, env=fast)
    nodes = [RayNode(head, cpus=1)]
    task = _busy_task(tmp_path, "busy", seconds=8)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [*_ray_cli(head, runs), str(task), "--attempts", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=head.env,
    )
    other = None
    try:
        (info,) = _wait_agent_phase(runs, proc, 1)
        batch, lost_dir = info["batch_id"], info["run_id"]
        assert _labels(test_owner)[info["sandbox_id"]]["opencode-tui.batch"] == batch
        other = _leftover(lost_dir, "b-other-batch")
        time.sleep(1.0)
        nodes[0].kill()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the driver has recorded the loss
            lost = json.loads((runs / lost_dir / "run.json").read_text())
            if lost["outcome"] is not None:
                break
            time.sleep(0.5)
        assert lost["outcome"]["failure_kind"] == "executor_worker_lost", lost["outcome"]
        assert "could not be swept" in lost["outcome"]["summary"]
        assert info["sandbox_id"] in _our_sandboxes(test_owner)  # still there: its node was gone
        nodes.append(RayNode(head, cpus=1))  # back, at the same address
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        for node in nodes:
            node.kill()
        head.stop()
    try:
        assert proc.returncode == 0, err
        (line,) = _lines(out)
        assert line["attempt"] == 2 and line["action"] == "scored" and line["batch_id"] == batch
        # (the address the node registered: Ray may take the host's own for 127.0.0.1)
        assert re.search(
            rf"node [0-9.]+ is back: the next episode there swept 1 sandbox\(es\) of lost run {lost_dir}", err
        ), err
        # The lost attempt's run.json: cleanup unknown when it was lost, confirmed once swept.
        lost = json.loads((runs / lost_dir / "run.json").read_text())
        assert lost["counts"]["cleanup_confirmed"] is True and lost["counts"]["cleanup_proof"] == "destroyed"
        assert "; later, node " in lost["outcome"]["summary"]
        assert _our_sandboxes(test_owner) == [other]
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=10).stdout
        assert info["sandbox_id"] not in ps
    finally:
        if other is not None:
            subprocess.run(
                [*CLI, "sweep", "--provider", "local", "--batch", "b-other-batch"],
                capture_output=True,
                timeout=60,
            )
    assert _our_sandboxes(test_owner) == []


# ---- SIGTERM on the driver -------------------------------------------------------------------


def test_sigterm_on_the_driver_closes_every_episode(ray_head, tmp_path, test_owner):
    tasks = [str(_busy_task(tmp_path, f"busy-{i}", seconds=120)) for i in range(1, 4)]
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [*_ray_cli(ray_head, runs), *tasks],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ray_head.env,
    )
    try:
        running = _wait_agent_phase(runs, proc, 2)  # two CPUs: the third is queued in Ray
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    lines = _lines(out)
    assert len(lines) == 3
    ran = [x for x in lines if x["started"]]
    queued = [x for x in lines if not x["started"]]
    assert {x["run_id"] for x in ran} == {i["run_id"] for i in running}
    for x in ran:  # closed gracefully, cleanup confirmed by the supervisor's receipt, recorded
        assert x["cancelled_by"] == "SIGTERM" and x["failure_kind"] == "run_cancelled"
        assert x["cleanup_confirmed"] is True and x["cleanup_proof"] == "receipt"
        info = json.loads(Path(x["run_dir"], "run.json").read_text())
        assert (
            info["outcome"]["failure_kind"] == "run_cancelled" and info["counts"]["cancelled_by"] == "SIGTERM"
        )
    assert len(queued) == 1 and queued[0]["cancelled_by"] == "SIGTERM" and queued[0]["exit_code"] == 143
    assert len(list(runs.glob("*/run.json"))) == 2  # the queued one created nothing
    assert "SIGTERM: closing every running episode" in err
    assert _our_sandboxes(test_owner) == []


# ---- the runs directory is not shared ----------------------------------------------------------


def test_a_runs_dir_the_workers_cannot_see_is_one_error_and_exit_2(tmp_path, test_owner):
    """A real node without the shared mount: the head and its workers run in a mount namespace where
    the runs directory's parent is an empty tmpfs (bubblewrap), the driver outside it."""
    shared = tmp_path / "shared"
    (shared / "runs").mkdir(parents=True)
    task = _task(tmp_path, "hello-file")
    head = RayHead(cpus=1, wrap=["bwrap", "--dev-bind", "/", "/", "--tmpfs", str(shared), "--"])
    try:
        r = _run(*_ray_args(head, shared / "runs"), str(task), timeout=300, env=head.env)
    finally:
        head.stop()
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("opencode-tui")]
    assert len(errors) == 1, r.stderr
    assert "must be shared storage mounted at the same path on every Ray node" in errors[0]
    assert "cannot read the probe file" in errors[0] and "No such file or directory" in errors[0]
    assert list((shared / "runs").iterdir()) == []  # no run, no results.jsonl, the probe removed
    assert _our_sandboxes(test_owner) == []


# ---- the batch screen on Ray ------------------------------------------------------------------


async def test_the_batch_screen_runs_on_ray_shows_each_rows_node_and_keeps_ray_off_the_terminal(
    ray_head, tmp_path, test_owner, wait, capfd, monkeypatch
):
    """Pilot, in this process as the driver (the app ``run TASK TASK --executor ray`` builds, with its
    output redirection): rows reach their outcomes and show the node their worker runs on. A worker is
    SIGKILLed mid-episode, so Ray's driver has something to say (``(raylet) A worker died ...``, which
    it prints to stdout): it is in the runs directory's executor.log, and nothing reaches stdout or
    stderr (the headless app hands anything printed to the real ones: capfd would see it)."""
    from opencode_tui.run_command import EXECUTOR_LOG, batch_tui, executor_logs
    from opencode_tui.screens.batch import BatchScreen
    from opencode_tui_core.admission import admit_run
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.resume import load_batch
    from opencode_tui_core.tasks import load_task

    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(key, ray_head.env[key])
    runs = tmp_path / "runs"
    config = AgentConfig.model_validate(
        {
            "sandbox": {"provider": "local"},
            "runs_dir": str(runs),
            "executor": {"name": "ray", "ray": {"address": ray_head.address}},
        }
    )
    tasks = [load_task(_busy_task(tmp_path, "busy", seconds=8)), load_task(SAMPLES / "oom")]
    admit_run(config, tasks, batch=False, attempts=2, jobs=None)  # the batch screen admits Ray now
    capfd.readouterr()
    with executor_logs(config, runs):
        app = batch_tui(config, tasks, runs, None, 2)
        async with app.run_test(size=(120, 30)) as pilot:
            screen = app.screen
            assert isinstance(screen, BatchScreen)
            board = app.board
            assert board.remote and [c.key for c in screen.table.columns][:2] == ["task", "node"]

            def busy_in_agent() -> bool:
                return any(r.task_id == "busy" and r.phase == "agent" for r in board.rows)

            await wait(pilot, busy_in_agent, timeout=240, what="busy's agent phase, reported by its worker")
            row = next(r for r in board.rows if r.task_id == "busy")
            assert re.fullmatch(r"[0-9.]+", row.node) and len(row.node_id) > 12, (row.node, row.node_id)
            info = json.loads((runs / row.run_id / "run.json").read_text())
            worker = int(info["controller"].split(".")[2])
            assert Path(f"/proc/{worker}/cmdline").read_bytes().startswith(b"ray::")
            await pilot.pause(1.0)  # OpenCode is inside its `sleep 8`
            os.kill(worker, signal.SIGKILL)
            await wait(pilot, lambda: board.ended, timeout=400, what="the batch to end")
            await pilot.pause(0.6)  # the last redraw
            lines = [screen.table._line(screen.table.get_row_at(i)) for i in range(len(board.rows))]
    assert app.summary is not None and app.error is None, app.error
    # Rows: busy's lost attempt (retried), its second (scored), oom (counted as zero); each on its node.
    shown = [(r.task_id, r.attempt, r.phase, r.outcome) for r in board.rows]
    assert shown == [
        ("busy", 1, "retried", ""),
        ("busy", 2, "done", "scored"),
        ("oom", 1, "done", "count_as_zero"),
    ], shown
    for r, line in zip(board.rows, lines, strict=True):
        assert r.node and r.node in line, (r.node, line)
    recorded = {x.task_id: x for x in load_batch(runs, app.summary.batch_id)}
    assert recorded["busy"].attempt == 2 and recorded["busy"].action == "scored"
    assert recorded["oom"].failure_kind == "provider_oom_killed"
    lost = json.loads((runs / row.run_id / "run.json").read_text())
    assert lost["outcome"]["failure_kind"] == "executor_worker_lost"
    # Ray's driver said the worker died: in the log, not on the terminal.
    log = (runs / EXECUTOR_LOG).read_text()
    assert "(raylet) A worker died" in log, log
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert await get_provider("local").listed(owner=test_owner) == []
