"""Sandbox benchmark: create→ready, exec round-trip and close-with-confirmed-cleanup, per provider.

    python benchmarks/sandbox.py                  # docker and local, 8 repetitions each
    python benchmarks/sandbox.py --quick          # 3 repetitions
    python benchmarks/sandbox.py --provider docker --reps 15 --json out.json

Measured for each provider, one fresh sandbox per repetition (after one unrecorded warm-up round):

- create→ready: ``provider.create(spec)`` until it returns (docker: image check, create, start, inspect,
  cgroup lookup, ``exec true`` until it succeeds; local: state dir, cgroup, keeper bwrap, nested-userns
  fence).
- exec round-trip: ``sandbox.exec(["true"])``, ``--execs`` times per sandbox.
- upload: ``sandbox.upload_file`` of 1 KB into /tmp, ``--execs`` times per sandbox (staging a session
  is a sequence of these).
- close: a ``SandboxSession`` runs a trivial harness (``true``) under the supervisor, then
  ``session.close()`` is timed: stop request + confirmed receipt (finalize), then release (destroy).
  The receipt must confirm cleanup; its two parts are shown as well.

Baselines measured in the same run, interleaved with the engine's repetitions:

- docker, SDK: ``containers.run(detach=True)`` with the engine's settings (init, network none, idle main),
  ``exec_create`` + ``exec_start`` + ``exec_inspect`` of ``true``, ``put_archive`` of the same one-file
  tar into an existing directory, ``remove(force=True)``.
- docker, CLI: ``docker run -d ...``, ``docker exec <id> true``, ``docker rm -f <id>``.
- local: a raw ``bwrap`` of ``true`` with fresh user/pid/ipc/uts/net namespaces and the same read-only
  system binds (``subprocess.run``); the close floor is SIGKILL + wait of a raw ``bwrap ... sleep``;
  the upload floor is a plain host file write.

Ratios are engine median / baseline median. Containers carry an owner label of this process; the
script checks at the end that none is left (and that the local state dir is empty).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench as B

OWNER = B.setup()

from opencode_tui_core.sandbox.base import SandboxSpec  # noqa: E402
from opencode_tui_core.sandbox.tarsafe import single_file_tar  # noqa: E402
from opencode_tui_core.session import SandboxSession  # noqa: E402

SESSION_DIR = "/tmp/.octui-bench/session"
PAYLOAD = b"x" * 1024
IDLE_MAIN = ["/bin/sh", "-c", "while :; do sleep 3600; done"]


def _now() -> float:
    return time.perf_counter()


# ---- engine side ---------------------------------------------------------------------------------


async def engine_round(provider: Any, image: str | None, execs: int, tag: str) -> dict[str, Any]:
    """One sandbox: create, ``execs`` x exec true, a trivial supervised harness, timed close."""
    spec = SandboxSpec(run_id=f"bench-sandbox-{tag}", image=image, labels={B.LABEL_OWNER: OWNER})
    t0 = _now()
    sb = await provider.create(spec)
    create = _now() - t0
    out: dict[str, Any] = {"create": create, "exec": []}
    log = B.OpLog()
    timed = B.make_timed_sandbox(sb, log)
    try:
        for _ in range(execs):
            t0 = _now()
            r = await sb.exec(["true"], timeout=30)
            out["exec"].append(_now() - t0)
            if not r.ok:
                raise RuntimeError(f"exec true failed: {r}")
        out["upload"] = []
        for k in range(execs):
            t0 = _now()
            await sb.upload_file(f"/tmp/octui-bench/u{k}.txt", PAYLOAD)
            out["upload"].append(_now() - t0)
        session = SandboxSession(timed, SESSION_DIR, run_timeout_s=60, close_timeout_s=30, python="python3")
        r = await session.execute(["true"])
        if not r.ok:
            raise RuntimeError(f"the trivial harness failed: {r.error} {r.stderr[-500:]!r}")
        n_before = len(log.ops)
        t0 = _now()
        receipt = await session.close()
        out["close"] = _now() - t0
        if receipt is None or receipt.cleanup_confirmed is not True:
            raise RuntimeError(f"cleanup not confirmed: {receipt}")
        closing = log.ops[n_before:]
        out["close_finalize"] = sum(o.duration for o in closing if o.kind == "exec")
        out["close_release"] = sum(o.duration for o in closing if o.kind == "release")
        out["confirmed"] = True
    finally:
        with contextlib.suppress(Exception):
            await sb.release()
    return out


# ---- docker baselines ----------------------------------------------------------------------------


def docker_sdk_round(client: Any, image: str, execs: int, tag: str) -> dict[str, Any]:
    api = client.api
    labels = {B.LABEL_RUN: f"bench-raw-{tag}", B.LABEL_OWNER: OWNER}
    t0 = _now()
    c = client.containers.run(
        image, entrypoint=IDLE_MAIN, detach=True, init=True, network_mode="none", labels=labels
    )
    out: dict[str, Any] = {"create": _now() - t0, "exec": []}
    try:
        for _ in range(execs):
            t0 = _now()
            e = api.exec_create(c.id, ["true"])
            api.exec_start(e["Id"])
            info = api.exec_inspect(e["Id"])
            out["exec"].append(_now() - t0)
            if info.get("ExitCode") != 0:
                raise RuntimeError(f"raw exec true: {info}")
        out["upload"] = []
        for k in range(execs):
            archive = single_file_tar(f"u{k}.txt", PAYLOAD, 0o644)
            t0 = _now()
            api.put_archive(c.id, "/tmp", archive)
            out["upload"].append(_now() - t0)
    finally:
        t0 = _now()
        c.remove(force=True)
        out["close"] = _now() - t0
    return out


def docker_cli_round(image: str, execs: int, tag: str) -> dict[str, Any]:
    args = ["docker", "run", "-d", "--init", "--network", "none", *B.raw_labels(OWNER, tag)]
    args += ["--entrypoint", IDLE_MAIN[0], image, *IDLE_MAIN[1:]]
    t0 = _now()
    cid = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout.strip()
    out: dict[str, Any] = {"create": _now() - t0, "exec": []}
    try:
        for _ in range(execs):
            t0 = _now()
            subprocess.run(["docker", "exec", cid, "true"], check=True, capture_output=True, timeout=60)
            out["exec"].append(_now() - t0)
    finally:
        t0 = _now()
        subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True, timeout=120)
        out["close"] = _now() - t0
    return out


# ---- local (bubblewrap) baselines ----------------------------------------------------------------


def bwrap_argv(command: list[str]) -> list[str]:
    from opencode_tui_core.sandbox.local.bwrap import _system_fs_args, resolve_bwrap

    return [
        resolve_bwrap().path,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        *_system_fs_args(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        *command,
    ]


def bwrap_round(execs: int) -> dict[str, Any]:
    true_argv = bwrap_argv(["/usr/bin/true"])
    out: dict[str, Any] = {"exec": []}
    for _ in range(execs):
        t0 = _now()
        subprocess.run(true_argv, check=True, stdin=subprocess.DEVNULL, timeout=30)
        out["exec"].append(_now() - t0)
    out["create"] = out["exec"][0]
    out["upload"] = []
    with tempfile.TemporaryDirectory() as d:
        for k in range(execs):
            t0 = _now()
            Path(d, f"u{k}.txt").write_bytes(PAYLOAD)
            out["upload"].append(_now() - t0)
    # Close floor: kill a raw bwrap sandbox and wait until it is gone.
    p = subprocess.Popen(bwrap_argv(["/bin/sh", "-c", "echo up; exec sleep 3600"]), stdout=subprocess.PIPE)
    assert p.stdout is not None
    p.stdout.readline()
    t0 = _now()
    p.send_signal(signal.SIGKILL)
    p.wait()
    out["close"] = _now() - t0
    p.stdout.close()
    return out


# ---- driver --------------------------------------------------------------------------------------


def collect(rounds: list[dict[str, Any]]) -> dict[str, list[float]]:
    keys = ("create", "close", "close_finalize", "close_release")
    data: dict[str, list[float]] = {k: [r[k] for r in rounds if k in r] for k in keys}
    data["exec"] = [x for r in rounds for x in r.get("exec", [])]
    data["upload"] = [x for r in rounds for x in r.get("upload", [])]
    data["create_ready"] = [r["create"] + r["exec"][0] for r in rounds if r.get("exec")]
    return data


async def bench_docker(reps: int, execs: int, image: str, rep: B.Report) -> dict[str, Any]:
    import docker

    from opencode_tui_core.sandbox.docker.provider import DockerProvider

    client = docker.from_env(timeout=120)
    provider = DockerProvider()
    engine: list[dict[str, Any]] = []
    sdk: list[dict[str, Any]] = []
    cli: list[dict[str, Any]] = []
    for i in range(reps + 1):  # round 0 warms up clients, image cache and page cache; not recorded
        rep.progress(f"docker round {i}/{reps}")
        e = await engine_round(provider, image, execs, f"d{i}")
        s = await asyncio.to_thread(docker_sdk_round, client, image, execs, f"s{i}")
        c = await asyncio.to_thread(docker_cli_round, image, execs, f"c{i}")
        if i:
            engine.append(e)
            sdk.append(s)
            cli.append(c)
    client.close()
    return {"engine": collect(engine), "sdk": collect(sdk), "cli": collect(cli)}


async def bench_local(reps: int, execs: int, rep: B.Report) -> dict[str, Any]:
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    base = Path(tempfile.mkdtemp(prefix="octui-bench-local-"))
    provider = LocalProvider(base_dir=base)
    engine: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    try:
        for i in range(reps + 1):
            rep.progress(f"local round {i}/{reps}")
            e = await engine_round(provider, None, execs, f"l{i}")
            r = await asyncio.to_thread(bwrap_round, execs)
            if i:
                engine.append(e)
                raw.append(r)
        left, cg_left = await asyncio.to_thread(local_leftovers, provider, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "engine": collect(engine),
        "raw_bwrap": collect(raw),
        "leftover_state_dirs": left,
        "leftover_cgroups": cg_left,
    }


def local_leftovers(provider: Any, base: Path) -> tuple[list[str], list[str]]:
    """State dirs under our base dir and sandbox cgroups under its cgroup parent."""
    left = [p.name for p in base.iterdir()]
    cg_parent, _why = provider._cgroup_parent()
    cg_left = [p.name for p in cg_parent.iterdir() if p.is_dir()] if cg_parent and cg_parent.is_dir() else []
    return left, cg_left


def rows_for(provider: str, res: dict[str, Any], baselines: list[tuple[str, str]]) -> list[list[str]]:
    """baselines: (result key, shown name)."""
    eng = res["engine"]
    metrics = [
        ("create→ready", "create", {"sdk": "create_ready", "cli": "create_ready", "raw_bwrap": "exec"}),
        ("exec true", "exec", {"sdk": "exec", "cli": "exec", "raw_bwrap": "exec"}),
        ("upload_file 1 KB", "upload", {"sdk": "upload", "raw_bwrap": "upload"}),
        ("close (confirmed)", "close", {"sdk": "close", "cli": "close", "raw_bwrap": "close"}),
        ("  finalize: stop+receipt", "close_finalize", {}),
        ("  release: destroy", "close_release", {"sdk": "close", "cli": "close", "raw_bwrap": "close"}),
    ]
    base_names = {
        "sdk": {
            "create_ready": "SDK run -d + exec true",
            "exec": "SDK exec create/start/inspect",
            "upload": "SDK put_archive (dir exists)",
            "close": "SDK remove(force)",
        },
        "cli": {
            "create_ready": "CLI docker run -d + exec true",
            "exec": "CLI docker exec true",
            "close": "CLI docker rm -f",
        },
        "raw_bwrap": {
            "exec": "raw bwrap true",
            "close": "kill+wait raw bwrap",
            "upload": "host write_bytes",
        },
    }
    rows: list[list[str]] = []
    for shown, key, bmap in metrics:
        xs = eng.get(key, [])
        first = True
        bl = [(k, bmap[k]) for k, _n in baselines if k in bmap]
        if not bl:
            rows.append([provider, shown, B.fmt_s(B.med(xs)), B.fmt_spread(xs), "", "", ""])
            continue
        for bkey, bmetric in bl:
            bx = res[bkey].get(bmetric, [])
            rows.append(
                [
                    provider if first else "",
                    shown if first else "",
                    B.fmt_s(B.med(xs)) if first else "",
                    B.fmt_spread(xs) if first else "",
                    base_names[bkey][bmetric],
                    B.fmt_s(B.med(bx)),
                    B.fmt_ratio(B.ratio(B.med(xs), B.med(bx))),
                ]
            )
            first = False
    return rows


def to_json(res: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in res.items():
        if isinstance(v, dict):
            out[k] = {m: B.summary(xs) for m, xs in v.items()}
        else:
            out[k] = v
    return out


async def main_async(args: argparse.Namespace) -> int:
    reps = args.reps or (3 if args.quick else 8)
    execs = args.execs or (3 if args.quick else 5)
    providers = ["docker", "local"] if args.provider == "all" else [args.provider]
    rep = B.Report("sandbox", args.json, {"reps": reps, "execs_per_sandbox": execs, "image": args.image})
    rep.say(f"sandbox benchmark: {reps} repetitions per provider (+1 warm-up), {execs} execs per sandbox")
    rows: list[list[str]] = []
    status = 0
    started = time.monotonic()
    try:
        if "docker" in providers:
            res = await bench_docker(reps, execs, args.image, rep)
            rep.data["docker"] = to_json(res)
            rows += rows_for("docker", res, [("sdk", "SDK"), ("cli", "CLI")])
        if "local" in providers:
            res = await bench_local(reps, execs, rep)
            rep.data["local"] = to_json(res)
            rows += rows_for("local", res, [("raw_bwrap", "bwrap")])
            if res["leftover_state_dirs"] or res["leftover_cgroups"]:
                status = 1
    finally:
        left = await asyncio.to_thread(B.leftovers, OWNER)
        B.remove_containers(left["ours"])
    rep.data["leftovers"] = left
    rep.say()
    rep.say(
        B.table(
            ["provider", "metric", "engine median", "min-max ms", "baseline", "baseline median", "ratio"],
            rows,
            title="Medians over all repetitions; ratio = engine median / baseline median",
        )
    )
    rep.say()
    if "local" in providers:
        loc = rep.data["local"]
        rep.say(f"local: leftover state dirs {loc['leftover_state_dirs']}, cgroups {loc['leftover_cgroups']}")
    rep.say(
        f"docker leftovers with our owner label ({OWNER}): {len(left['ours'])} "
        f"(all containers labelled {B.LABEL_RUN} on this engine, any owner: {left['all_opencode_tui_run']})"
    )
    rep.say(f"total run time {time.monotonic() - started:.0f} s")
    if left["ours"]:
        status = 1
    rep.finish()
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--provider", choices=["docker", "local", "all"], default="all")
    p.add_argument("--reps", type=int, help="sandboxes per provider (default 8, --quick 3)")
    p.add_argument("--execs", type=int, help="exec round-trips per sandbox (default 5, --quick 3)")
    p.add_argument("--image", default=B.IMAGE)
    B.add_common_args(p)
    args = p.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
