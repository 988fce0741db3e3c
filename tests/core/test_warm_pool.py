"""The batch's warm pool (issue 31): sandboxes prepared ahead of their episodes, each used once, every
unused one released and confirmed. Real episodes on docker and local (bubblewrap), the real OpenCode
binary, the embedded scripted model."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig, BatchSettings, warm_depth
from opencode_tui_core.episode.pool import WarmPool, pool_key
from opencode_tui_core.events import EpisodeStarted, OpenCodeEvent, WarmSandbox
from opencode_tui_core.sandbox.base import LABEL_BATCH, LABEL_POOL
from opencode_tui_core.sandbox.providers import get_provider
from opencode_tui_core.tasks import Task, load_task

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
OTHER_IMAGE = "opencode-tui/base-norg:bookworm"


def _tasks(root: Path, n: int, image: str | None = None, linger_s: int = 0) -> list[Task]:
    """``n`` copies of hello-file; ``linger_s``: the agent's shell command sleeps that long first, so
    an episode lasts longer than preparing the next sandbox (as a real agent's minutes do)."""
    out = []
    for i in range(n):
        d = root / f"hello-{i}"
        shutil.copytree(SAMPLES / "hello-file", d)
        text = (d / "task.yaml").read_text().replace("id: hello-file", f"id: hello-{i}")
        if image is not None:
            text += f"image: {image}\n"
        (d / "task.yaml").write_text(text)
        if linger_s:
            trajectory = d / "trajectory.yaml"
            trajectory.write_text(
                trajectory.read_text().replace(
                    'command: "cat hello.txt"', f'command: "sleep {linger_s}; cat hello.txt"'
                )
            )
        out.append(load_task(d))
    return out


def _nonroot_fixture():
    """The non-root task of issue 17 (tests/fixtures/nonroot_task.py; tests/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "nonroot_task", SAMPLES.parent / "tests" / "fixtures" / "nonroot_task.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _left(provider: str, config: AgentConfig, owner: str, label: str, value: str) -> list[str]:
    records = await get_provider(provider, config).listed(owner=owner)
    return [r.sandbox_id for r in records if r.labels.get(label) == value]


async def _prepared(pool: WarmPool, n: int, *, within_s: float) -> None:
    """Until ``n`` preparations have ended (prepared or failed)."""
    deadline = time.monotonic() + within_s
    while pool.counts.prepared + pool.counts.failed < n:
        assert time.monotonic() < deadline, "nothing was prepared"
        await asyncio.sleep(0.1)


def test_the_default_depth_is_the_free_cpu():
    assert warm_depth(BatchSettings(), jobs=1, cpus=2) == 1
    assert warm_depth(BatchSettings(), jobs=2, cpus=8) == 4  # at most 4
    assert warm_depth(BatchSettings(), jobs=2, cpus=2) == 0  # no free core: none
    assert warm_depth(BatchSettings(), jobs=4, cpus=2) == 0
    assert warm_depth(BatchSettings(warm=0), jobs=1, cpus=8) == 0  # off
    assert warm_depth(BatchSettings(warm=3), jobs=1, cpus=2) == 3


def test_the_key_names_what_must_match(tmp_path):
    config = AgentConfig()
    [a] = _tasks(tmp_path / "a", 1)
    [b] = _tasks(tmp_path / "b", 1, image=OTHER_IMAGE)
    assert pool_key(a, config) is not None and pool_key(a, config) != pool_key(b, config)
    user = config.model_copy(update={"sandbox": config.sandbox.model_copy(update={"user": "1000"})})
    assert pool_key(a, user) != pool_key(a, config)
    borrowed = config.model_copy(
        update={"sandbox": config.sandbox.model_copy(update={"mode": "borrowed", "sandbox_id": "x"})}
    )
    assert pool_key(a, borrowed) is None


@pytest.mark.slow
async def test_a_batch_of_four_with_warm_two(episode_provider, tmp_path, test_owner):
    """Every attempt after the first got a sandbox whose preparation finished before the attempt
    started (its events say so); all scored; nothing left, prepared ones included."""
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": episode_provider}, "batch": {"warm": 2}, "policy": {"max_attempts": 1}}
    )
    tasks = _tasks(tmp_path / "tasks", 4, linger_s=6)
    summary = await run_batch(tasks, config, runs_dir=tmp_path / "runs", jobs=1)
    assert summary.scored == 4, summary.line()
    assert summary.warm is not None
    assert (summary.warm.prepared, summary.warm.used, summary.warm.discarded) == (3, 3, 0)
    assert "warm sandboxes: 3 prepared, 3 used, 0 discarded" in summary.line()
    by_task = {r.task_id: r for r in summary.results}
    for i, task in enumerate(tasks):
        result = by_task[task.id]
        assert result.cleanup_confirmed and result.warm is (i > 0)
        events = list(RunDirReader(Path(result.run_dir)).events())
        warm = [e for e in events if isinstance(e, WarmSandbox)]
        if i == 0:
            assert warm == []  # it started at once: nothing to prepare ahead
            continue
        [started] = [e for e in events if isinstance(e, EpisodeStarted)]
        [w] = warm
        assert w.prepared_at <= started.ts and w.waited_s == 0, (w, started.ts)
        assert w.sandbox_id == result.sandbox_id and w.pool_run.startswith("pool-")
        # OpenCode's server was started ahead too: ready before this task's prompt reached it.
        assert w.server_ahead
        said = [
            e.event_type
            for e in events
            if isinstance(e, OpenCodeEvent) and e.event_type.startswith("runner.")
        ]
        assert said.index("runner.ready") < said.index("runner.task") < said.index("runner.prompt_sent"), said
    assert await _left(episode_provider, config, test_owner, LABEL_BATCH, summary.batch_id or "") == []


@pytest.mark.slow
async def test_a_task_with_another_image_is_not_given_the_prepared_sandbox(
    episode_provider, tmp_path, test_owner
):
    config = AgentConfig.model_validate({"sandbox": {"provider": episode_provider}})
    first, same = _tasks(tmp_path / "x", 2)
    [other] = _tasks(tmp_path / "y", 1, image=OTHER_IMAGE)
    pool = WarmPool(config, depth=1, batch_id="bwarmtest01")
    try:
        pool.plan([first, same], starting=1)  # the first starts at once: one is prepared, for `same`
        await _prepared(pool, 1, within_s=120)
        assert pool.counts.prepared == 1
        assert await pool.take(other) is None  # another image: not given the prepared one
        lease = await pool.take(same)
        assert lease is not None and lease.event.waited_s == 0
        if episode_provider == "docker":
            image = subprocess.run(
                ["docker", "inspect", "-f", "{{.Config.Image}}", lease.sandbox.sandbox_id],
                capture_output=True,
                text=True,
            ).stdout.strip()
            assert image == same.image
        await lease.sandbox.release()
        lease.finished()
    finally:
        counts = await pool.close()
    assert (counts.used, counts.discarded) == (1, 0)
    assert await _left(episode_provider, config, test_owner, LABEL_POOL, "bwarmtest01") == []


@pytest.mark.slow
async def test_an_unused_prepared_sandbox_is_released_and_confirmed(episode_provider, tmp_path, test_owner):
    """The batch ends (or is cancelled) with sandboxes prepared for tasks that never ran: each is
    released, and its engine confirms it gone."""
    config = AgentConfig.model_validate({"sandbox": {"provider": episode_provider}})
    tasks = _tasks(tmp_path / "x", 3)
    pool = WarmPool(config, depth=2, batch_id="bwarmtest02")
    try:
        pool.plan(tasks, starting=1)
        await _prepared(pool, 2, within_s=180)
        assert len(await _left(episode_provider, config, test_owner, LABEL_POOL, "bwarmtest02")) == 2
    finally:
        counts = await pool.close()
    assert (counts.prepared, counts.used, counts.discarded, counts.released_confirmed) == (2, 0, 2, 2)
    assert await _left(episode_provider, config, test_owner, LABEL_POOL, "bwarmtest02") == []


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_prepared_sandbox_past_its_max_age_is_discarded_never_used(tmp_path, test_owner):
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "batch": {"warm_max_age_s": 1}})
    first, same = _tasks(tmp_path / "x", 2)
    pool = WarmPool(config, depth=1, batch_id="bwarmtest03")
    try:
        pool.plan([first, same], starting=1)
        deadline = time.monotonic() + 120
        while pool.counts.prepared + pool.counts.failed < 1:
            assert time.monotonic() < deadline, "nothing was prepared"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)
        # The first one waited too long: released, and another prepared for the task still to run.
        lease = await pool.take(same)
        assert lease is None or lease.event.pool_run != "pool-bwarmtest03-1"
        if lease is not None:
            assert lease.event.age_s <= 1
            await lease.sandbox.release()
            lease.finished()
    finally:
        counts = await pool.close()
    assert counts.discarded >= 1 and counts.used <= 1
    assert counts.released_confirmed == counts.discarded
    assert await _left("local", config, test_owner, LABEL_POOL, "bwarmtest03") == []


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_second_preparation_starts_only_while_an_attempt_waits(tmp_path, test_owner):
    """While the pool keeps up it prepares one sandbox at a time (a booting OpenCode takes a core
    from the running episode); once an attempt waits for the one under way, a second starts."""
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    tasks = _tasks(tmp_path / "x", 4)
    pool = WarmPool(config, depth=2, batch_id="bwarmtest05")
    leases = []
    try:
        pool.plan(tasks, starting=1)
        await asyncio.sleep(0.5)
        assert pool.preparing == 1 and pool.counts.prepared == 0  # nobody waits: one at a time
        waiting = asyncio.ensure_future(pool.take(tasks[1]))
        deadline = time.monotonic() + 5
        while pool.preparing < 2:
            assert pool.counts.prepared == 0, "the first was ready before a second one started"
            assert time.monotonic() < deadline, "no second preparation while an attempt waited"
            await asyncio.sleep(0.02)
        leases.append(await waiting)
        leases.append(await pool.take(tasks[2]))
        assert all(lease is not None for lease in leases)
        assert pool.counts.prepared == 2
    finally:
        for lease in leases:
            if lease is not None:
                await lease.sandbox.release()
                lease.finished()
        counts = await pool.close()
    assert counts.used == 2 and counts.released_confirmed == counts.discarded
    assert await _left("local", config, test_owner, LABEL_POOL, "bwarmtest05") == []


def _first_agent_request(run_dir: str) -> dict:
    """The first agent call's request as OpenCode sent it: its messages and tools, with the name of
    OpenCode's private directory (``/tmp/.opencode-tui-<run>``, named in "Instructions from: …")
    made neutral: it differs between any two runs, cold ones too."""
    calls = [json.loads(line) for line in (Path(run_dir) / "model_calls.jsonl").read_text().splitlines()]
    [body] = [c["request_body"] for c in calls if c["kind"] == "agent"][:1]
    text = json.dumps({"messages": body["messages"], "tools": body.get("tools")})
    return json.loads(re.sub(r"/tmp/\.opencode-tui-[A-Za-z0-9._-]+/", "/tmp/.opencode-tui-RUN/", text))


@pytest.mark.slow
@pytest.mark.parametrize("git", [False, True], ids=["plain", "git-repo"])
async def test_a_server_started_ahead_asks_the_model_exactly_what_a_cold_start_does(
    episode_provider, tmp_path, test_owner, git
):
    """OpenCode's server started before the task existed is configured as the task's own: the first
    agent request of a warm episode (instructions, system prompt, tools) is the one a cold start of
    the same task sends. A task whose files hold a git repository has its session opened only once
    its files are there (OpenCode decides the project then)."""
    if git and episode_provider != "local":
        pytest.skip("the git variant exercises the pool's logic, the same on every provider")
    tasks = []
    for i, rule in enumerate(["Alpha rule: be brief.", "Beta rule: be exact."]):
        d = tmp_path / "tasks" / f"ahead-{i}"
        shutil.copytree(SAMPLES / "hello-file", d)
        text = (d / "task.yaml").read_text().replace("id: hello-file", f"id: ahead-{i}")
        text += f"instructions: {json.dumps(rule)}\n"
        if git:
            (d / "files").mkdir()
            (d / "files" / "README").write_text("a repository\n")
            subprocess.run(["git", "init", "-q", str(d / "files")], check=True)
            text += "files: files\n"
        (d / "task.yaml").write_text(text)
        tasks.append(load_task(d))
    base = {"sandbox": {"provider": episode_provider}, "policy": {"max_attempts": 1}}
    warm = await run_batch(
        tasks,
        AgentConfig.model_validate({**base, "batch": {"warm": 1}}),
        runs_dir=tmp_path / "warm",
        jobs=1,
    )
    cold = await run_batch(
        tasks[1:],
        AgentConfig.model_validate({**base, "batch": {"warm": 0}}),
        runs_dir=tmp_path / "cold",
        jobs=1,
    )
    assert warm.scored == 2 and cold.scored == 1, (warm.line(), cold.line())
    [ahead] = [r for r in warm.results if r.task_id == "ahead-1"]
    assert ahead.warm
    events = list(RunDirReader(Path(ahead.run_dir)).events())
    [w] = [e for e in events if isinstance(e, WarmSandbox)]
    assert w.server_ahead
    said = [
        e.event_type for e in events if isinstance(e, OpenCodeEvent) and e.event_type.startswith("runner.")
    ]
    # Opened ahead unless the task brings a repository: then after its files (and prompt) arrived.
    assert (said.index("runner.session") > said.index("runner.task")) is git, said
    got, want = _first_agent_request(ahead.run_dir), _first_agent_request(cold.results[0].run_dir)
    system = json.dumps(got["messages"][0])
    assert "Beta rule" in system and "Alpha rule" not in system
    assert got == want
    assert await _left(episode_provider, AgentConfig(), test_owner, LABEL_POOL, warm.batch_id or "") == []


@pytest.mark.slow
async def test_an_attempt_cancelled_before_its_agent_phase_stops_the_server_started_ahead(
    episode_provider, tmp_path, test_owner
):
    """The attempt took a prepared sandbox whose OpenCode server waits for its task, and was cancelled
    before giving it: the server's supervisor stops it and its receipt is in this run's record, then
    the sandbox is released."""
    from opencode_tui_core.episode.episode import Episode
    from opencode_tui_core.events import CleanupObserved, CleanupStep, StepState

    config = AgentConfig.model_validate({"sandbox": {"provider": episode_provider}})
    [task] = _tasks(tmp_path / "x", 1)
    pool = WarmPool(config, depth=1, batch_id="bwarmtest04")
    try:
        pool.plan([task])
        await _prepared(pool, 1, within_s=180)
        episode = Episode(task, config, runs_dir=tmp_path / "runs", pool=pool)
        cancels: list[asyncio.Task[None]] = []

        def on_event(event: object) -> None:
            if isinstance(event, WarmSandbox):
                cancels.append(asyncio.ensure_future(episode.cancel()))

        episode.bus.subscribe(on_event)
        result = await asyncio.wait_for(episode.run(), 180)
        await asyncio.gather(*cancels)
    finally:
        counts = await pool.close()
    assert counts.used == 1 and result.warm and result.cancelled_by is not None, result
    events = list(RunDirReader(Path(result.run_dir)).events())
    [w] = [e for e in events if isinstance(e, WarmSandbox)]
    assert w.server_ahead
    receipts = [e for e in events if isinstance(e, CleanupObserved) and e.step is CleanupStep.RECEIPT]
    assert [r.state for r in receipts] == [StepState.OK], receipts
    assert await _left(episode_provider, config, test_owner, LABEL_POOL, "bwarmtest04") == []


@pytest.mark.slow
@pytest.mark.bwrap
async def test_the_run_deadline_of_a_server_started_ahead_starts_with_its_task(tmp_path, test_owner):
    """A task with a 10 s run budget, whose prepared server waited 12 s for it: the wait is not the
    agent's time (the supervisor's clock starts when the task arrives), so the attempt scores."""
    from opencode_tui_core.episode.episode import Episode

    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    [task] = _tasks(tmp_path / "x", 1)
    task = task.model_copy(update={"limits": task.limits.model_copy(update={"run_s": 10})})
    pool = WarmPool(config, depth=1, batch_id="bwarmtest05")
    try:
        pool.plan([task])
        await _prepared(pool, 1, within_s=180)
        await asyncio.sleep(12)
        result = await asyncio.wait_for(
            Episode(task, config, runs_dir=tmp_path / "runs", pool=pool).run(), 180
        )
    finally:
        await pool.close()
    assert result.warm and result.action == "scored" and result.reward == 1, result
    events = list(RunDirReader(Path(result.run_dir)).events())
    [w] = [e for e in events if isinstance(e, WarmSandbox)]
    assert w.server_ahead and w.age_s >= 12


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("unreadable", [False, True], ids=["scored", "unreadable"])
async def test_a_server_started_ahead_takes_its_task_as_the_sandbox_user(tmp_path, test_owner, unreadable):
    """The runner started ahead takes its task from its episode through the model relay
    (opencode_tui_core.episode.handoff): it unpacks the files as the image's non-root user (uid 1000) and runs the
    access check. Nothing else uploads the task, so a scored run shows the handoff carried it; the
    agent and verifier then see the modes and owners a cold start gives. A file that user cannot read
    fails the attempt in the seed phase with the cold start's own failure, and nothing is left."""
    from opencode_tui_core.artifacts import RunFiles
    from opencode_tui_core.episode.episode import Episode

    nonroot = _nonroot_fixture()

    image = subprocess.run(["docker", "image", "inspect", nonroot.NONROOT_IMAGE], capture_output=True)
    if image.returncode != 0:
        pytest.skip(f"{nonroot.NONROOT_IMAGE} is unavailable (scripts/build-images)")
    config = AgentConfig.model_validate({"sandbox": {"provider": "docker"}})
    task = load_task(nonroot.make_task(tmp_path / "t", unreadable=unreadable))
    pool = WarmPool(config, depth=1, batch_id="bwarmtest06")
    try:
        pool.plan([task])
        await _prepared(pool, 1, within_s=180)
        assert pool.counts.prepared == 1, pool.counts
        result = await asyncio.wait_for(
            Episode(task, config, runs_dir=tmp_path / "runs", pool=pool).run(), 180
        )
    finally:
        counts = await pool.close()
    assert result.warm and counts.used == 1, (result.summary, counts)
    events = list(RunDirReader(Path(result.run_dir)).events())
    [w] = [e for e in events if isinstance(e, WarmSandbox)]
    assert w.server_ahead
    if unreadable:
        assert (result.failure_kind, result.failure_stage, result.action) == (
            "sandbox_permission_denied",
            "seed",
            "mark_evaluation_error",
        ), result.summary
        diagnostics = (Path(result.run_dir) / RunFiles.DIAGNOSTICS).read_text()
        assert (
            "agent (uid 1000, gid 1000) cannot read /app/secret.txt (mode 000, owner 1000:1000)"
            in diagnostics
        )
    else:
        nonroot.check_scored_run(result, "agent", "image")
    assert await _left("docker", config, test_owner, LABEL_POOL, "bwarmtest06") == []
