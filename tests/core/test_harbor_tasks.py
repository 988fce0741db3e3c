"""Harbor task directories (core/harbor.py, core/image_build.py): task.toml + instruction.md +
environment/Dockerfile + tests/test.sh, run for real on Docker.

The images are built with the Docker SDK from the task's own Dockerfile (FROM the locally built base
image; builds have no network), the tests are copied to /tests after confirmed cleanup and run as the
verifier, and the reward is read from Harbor's /logs/verifier/reward.txt (or reward.json).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from opencode_tui.cli import main as cli
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.harbor import reward_from_json
from opencode_tui_core.tasks import load_task, task_content_hash

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / "sample_tasks" / "harbor"
BASE_IMAGE = "opencode-tui/base:bookworm"


def test_sample_maps_onto_a_task():
    t = load_task(HARBOR / "fix-calc")
    assert (t.id, t.format, t.workdir) == ("fix-calc", "harbor", "/app")
    assert t.problem_statement.startswith("`/app/calc.py` defines `mean(values)`")
    assert t.build is not None and t.build.timeout == 300.0
    assert t.image.startswith("opencode-tui/task-fix-calc:")
    assert (t.verify.timeout, t.verify.user, t.verify.files_target) == (120.0, "root", "/tests")
    assert t.verify.reward_file == "/logs/verifier/reward.txt"
    assert "export CALC_MODULE=calc;" in t.verify.command and "bash /tests/test.sh" in t.verify.command
    assert (t.limits.run_s, t.limits.cpus, t.limits.memory_bytes) == (600.0, 1.0, 1024 << 20)
    assert t.load_warnings == []


def test_unknown_fields_warn_by_name(tmp_path):
    task = shutil.copytree(HARBOR / "hello-world", tmp_path / "t")
    toml = task / "task.toml"
    toml.write_text("future_section = 1\n" + toml.read_text() + "\n[verifier.extra_knob]\nx = 1\n")
    toml.write_text(toml.read_text().replace("[environment]\n", "[environment]\ngpus = 0\n"))
    t = load_task(task)
    assert t.load_warnings == [
        "unknown task.toml field(s) ignored: future_section, verifier.extra_knob",
        "task.toml field(s) not applied by opencode-tui: environment.gpus",
    ]


def test_the_image_tag_follows_the_build_context(tmp_path):
    task = shutil.copytree(HARBOR / "hello-world", tmp_path / "t")
    before = load_task(task)
    content_before = task_content_hash(before)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    same_image = load_task(task)
    assert same_image.image == before.image  # the tests are not part of the image
    assert task_content_hash(same_image) != content_before  # ... but of the task
    (task / "environment" / "Dockerfile").write_text("FROM opencode-tui/base:bookworm\nWORKDIR /work\n")
    rebuilt = load_task(task)
    assert rebuilt.image != before.image and rebuilt.workdir == "/work"


def test_reward_json():
    assert reward_from_json('{"reward": 0.5, "style": 1}') == 0.5
    assert reward_from_json('{"accuracy": 0.25}') == 0.25
    with pytest.raises(ValueError, match="no numeric 'reward'"):
        reward_from_json('{"a": 1, "b": 2}')


def test_local_provider_refuses_a_build_in_one_line(capsys):
    assert cli(["run", str(HARBOR / "hello-world"), "--batch", "--provider", "local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use --provider docker" in err[0] and "environment/Dockerfile" in err[0]


def _variant(tmp_path: Path, name: str, test_sh: str | None = None, dockerfile: str | None = None) -> Path:
    task = shutil.copytree(HARBOR / "hello-world", tmp_path / name)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace('name = "opencode-tui/hello-world"', f'name = "opencode-tui/{name}"')
    )
    if test_sh is not None:
        (task / "tests" / "test.sh").write_text(test_sh)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


@pytest.fixture(scope="module")
def harbor_runs(tmp_path_factory):
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.skip("docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)")
    tmp = tmp_path_factory.mktemp("harbor")
    dirs = [
        HARBOR / "hello-world",
        HARBOR / "fix-calc",
        _variant(tmp, "half-reward", test_sh="#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n"),
        _variant(
            tmp,
            "json-reward",
            test_sh="#!/bin/bash\necho '{\"reward\": 0.25}' > /logs/verifier/reward.json\n",
        ),
        _variant(
            tmp,
            "broken-build",
            dockerfile="FROM opencode-tui/base:bookworm\nRUN echo building && echo no-such-thing >&2 && exit 3\n",
        ),
    ]
    # A build past its deadline. The engine finishes it anyway (under a scratch name) and keeps its
    # layers: a fresh RUN line per test run keeps the layer cache from making it instant; the
    # scratch images of earlier runs are removed first.
    stale = subprocess.run(
        ["docker", "images", "-q", "--filter", "reference=opencode-tui/task-slow-build"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if stale:
        subprocess.run(["docker", "rmi", "-f", *set(stale)], capture_output=True)
    fresh = uuid.uuid4().hex
    slow = _variant(
        tmp, "slow-build", dockerfile=f"FROM opencode-tui/base:bookworm\nRUN echo {fresh} && sleep 30\n"
    )
    toml = slow / "task.toml"
    toml.write_text(toml.read_text().replace("build_timeout_sec = 300.0", "build_timeout_sec = 3.0"))
    dirs.append(slow)
    config = AgentConfig.model_validate({"sandbox": {"provider": "docker"}, "policy": {"max_attempts": 2}})
    summary = asyncio.run(run_batch([load_task(d) for d in dirs], config, runs_dir=tmp / "runs", jobs=2))
    return {r.task_id: r for r in summary.results}


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)  # the module's batch runs in the first one's setup
@pytest.mark.parametrize("task_id", ["hello-world", "fix-calc"])
def test_harbor_samples_score_one(harbor_runs, task_id):
    r = harbor_runs[task_id]
    assert (r.action.value, r.reward, r.failure_kind) == ("scored", 1.0, None), r.summary
    run_dir = Path(r.run_dir)
    log = (run_dir / "build" / "image.log").read_text()
    assert "opencode-tui/task-" in log  # built now or found from an earlier build of the same context
    info = json.loads((run_dir / "run.json").read_text())
    assert info["verifier_user"] == "root"
    if task_id == "hello-world":
        # The agent looked for /tests (its trajectory, as exported): they arrive only after cleanup.
        traj = json.loads((run_dir / "trajectory.json").read_text())
        seen = [r["content"] for s in traj["steps"] for r in (s.get("observation") or {}).get("results", [])]
        assert seen[0].strip() == "tests: absent", seen


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)  # the module's batch runs in the first one's setup
def test_reward_file_values_are_the_reward(harbor_runs):
    assert (harbor_runs["half-reward"].action.value, harbor_runs["half-reward"].reward) == ("scored", 0.5)
    assert (harbor_runs["json-reward"].action.value, harbor_runs["json-reward"].reward) == ("scored", 0.25)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)  # the module's batch runs in the first one's setup
def test_a_failed_build_is_an_infrastructure_failure_at_seed(harbor_runs):
    r = harbor_runs["broken-build"]
    assert (r.action.value, r.failure_kind, r.failure_stage, r.failure_class) == (
        "mark_evaluation_error",
        "image_build_failed",
        "seed",
        "evaluation",
    )
    assert r.reward is None and r.exit_code == 3
    assert r.attempt == 1  # the same context would fail the same way: no retry
    run_dir = Path(r.run_dir)
    log = (run_dir / "build" / "image.log").read_text()
    assert "no-such-thing" in log and "exit 3" not in log.splitlines()[0]
    failures = [
        json.loads(line)
        for line in (run_dir / "events.jsonl").read_text().splitlines()
        if '"type":"failure"' in line
    ]
    # The build's output also streamed as terminal output (the TUI's terminal panel, terminal.cast).
    shown = "".join(
        json.loads(line)["data"]
        for line in (run_dir / "events.jsonl").read_text().splitlines()
        if '"type":"terminal"' in line
    )
    assert "no-such-thing" in shown and "no-such-thing" in (run_dir / "terminal.cast").read_text()
    [ev] = [f["failure"] for f in failures if f["failure"]["kind"] == "image_build_failed"]
    [evidence] = ev["evidence"]
    assert evidence["source"] == "docker.build" and "no-such-thing" in evidence["data"]["log_tail"]
    assert "returned a non-zero code: 3" in ev["message"]
    # Nothing was created for it: no container of this run.
    slow = harbor_runs["slow-build"]
    assert (slow.failure_kind, slow.failure_stage) == ("image_build_failed", "seed")
    [message] = [
        json.loads(line)["failure"]["message"]
        for line in Path(slow.run_dir, "events.jsonl").read_text().splitlines()
        if '"type":"failure"' in line
    ]
    assert "did not finish within 3s" in message
    assert slow.durations_s["seed"] < 25  # the deadline held: the 30 s build was not waited out
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.run={r.run_id}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert left == []


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)  # the module's batch runs in the first one's setup
def test_the_next_build_removes_what_an_abandoned_build_tagged_late(harbor_runs):
    """The slow build was abandoned at its 3 s deadline; the engine goes on and tags it under its
    scratch name about 30 s later. The next build of any task (here a cached one) removes that tag."""
    from opencode_tui_core.sandbox.docker.image_build import build_task_image
    from opencode_tui_core.sandbox.docker.settings import DockerSettings

    def scratch() -> list[str]:
        out = subprocess.run(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "opencode-tui/task-slow-build"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        return [t for t in out if ":building-" in t]

    for _ in range(120):  # the abandoned build's `sleep 30`, plus the engine's own time
        if scratch():
            break
        time.sleep(0.5)
    assert scratch(), "the engine never finished the abandoned build: nothing to remove"
    lines: list[str] = []
    task = load_task(HARBOR / "hello-world")
    assert asyncio.run(build_task_image(task, DockerSettings(), lines.append)) == task.image
    assert scratch() == []
    assert any("removed opencode-tui/task-slow-build:building-" in line for line in lines), lines


@pytest.mark.slow
@pytest.mark.docker
def test_a_cached_task_image_is_rebuilt_when_its_base_changed(tmp_path):
    """The tag hashes the build context; the base is tracked by image ID in a label. Re-pointing the
    base tag (as scripts/build-images does after a change) makes the next build rebuild."""
    from opencode_tui_core.sandbox.docker.image_build import BASES_LABEL, build_task_image
    from opencode_tui_core.sandbox.docker.settings import DockerSettings

    base = f"opencode-tui/test-base-{uuid.uuid4().hex[:8]}:latest"

    def docker(*args: str) -> str:
        return subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=120, check=True
        ).stdout.strip()

    def inspect(ref: str, fmt: str) -> str:
        return docker("image", "inspect", "--format", fmt, ref)

    docker("tag", BASE_IMAGE, base)
    task = load_task(
        _variant(tmp_path, f"base-{uuid.uuid4().hex[:8]}", dockerfile=f"FROM {base}\nRUN true\n")
    )
    try:
        lines: list[str] = []
        asyncio.run(build_task_image(task, DockerSettings(), lines.append))
        first = inspect(task.image, "{{.Id}}")
        assert inspect(task.image, f'{{{{index .Config.Labels "{BASES_LABEL}"}}}}') == (
            f"{base}={inspect(BASE_IMAGE, '{{.Id}}')}"
        )
        lines.clear()
        asyncio.run(build_task_image(task, DockerSettings(), lines.append))
        assert any("(cached)" in line for line in lines) and inspect(task.image, "{{.Id}}") == first
        docker("tag", "opencode-tui/nopython:bookworm", base)  # the base changed under the same name
        lines.clear()
        asyncio.run(build_task_image(task, DockerSettings(), lines.append))
        assert any("base image changed" in line for line in lines), lines
        assert inspect(task.image, "{{.Id}}") != first
        assert inspect(task.image, f'{{{{index .Config.Labels "{BASES_LABEL}"}}}}').endswith(
            inspect("opencode-tui/nopython:bookworm", "{{.Id}}")
        )
    finally:
        subprocess.run(["docker", "rmi", "-f", task.image, base], capture_output=True, timeout=120)
