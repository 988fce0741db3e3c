"""The sandbox-user pieces that need no sandbox (issue 17): user specs, exits in words, archives that
carry owners and modes whatever the umask, and the rerooting Docker uploads rely on."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.runtime.access import requested_user
from opencode_tui_core.sandbox.base import describe_exit, parse_user_spec
from opencode_tui_core.sandbox.tarsafe import check_archive, directory_tar, reroot, tree_tar
from opencode_tui_core.tasks import Task


def _members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        return {m.name: m for m in tf.getmembers()}


def test_user_specs() -> None:
    assert parse_user_spec("agent") == ("agent", None, None)
    assert parse_user_spec("1000") == (None, 1000, None)
    assert parse_user_spec("1000:1001") == (None, 1000, 1001)
    for bad in ("", "agent:staff", "1000:x"):
        with pytest.raises(ValueError):
            parse_user_spec(bad)
    with pytest.raises(ValueError):
        AgentConfig.model_validate({"sandbox": {"user": "agent:staff"}})
    with pytest.raises(ValueError):
        Task.model_validate({"id": "t", "problem_statement": "p", "verify": {"command": "true", "user": ""}})


def test_the_config_user_wins_over_the_task_and_the_image() -> None:
    assert requested_user("1000", "agent") == ("1000", "config")
    assert requested_user(None, "agent") == ("agent", "task")
    assert requested_user(None, None) == (None, "image")


def test_an_exit_never_observed_is_said_in_words() -> None:
    assert describe_exit(None, subject="OpenCode") == "OpenCode's exit was not observed"
    assert describe_exit(3, subject="OpenCode") == "OpenCode exited with 3"
    assert describe_exit(None, 9, subject="OpenCode") == "OpenCode was killed by signal 9"
    assert "None" not in describe_exit(None)


def test_archives_carry_owner_and_modes_not_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        src = tmp_path / "files"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "a.txt").write_text("a")
        (src / "locked").write_text("x")
        (src / "locked").chmod(0o000)
        archive = directory_tar(src, owner=(1000, 1001), root_mode=0o755)
    finally:
        os.umask(old)
    members = _members(archive)
    assert members["."].isdir() and members["."].mode == 0o755
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(1000, 1001, "", "")}
    assert members["locked"].mode == 0o000  # deliberately unreadable stays so
    assert members["sub"].mode == 0o700  # the host's own mode (made under umask 077)
    check_archive(archive)

    tree = _members(
        tree_tar({"home": (None, 0o700), "cfg.json": (b"{}", 0o600)}, owner=(7, 8), root_mode=0o700)
    )
    assert (tree["."].mode, tree["home"].mode, tree["cfg.json"].mode) == (0o700, 0o700, 0o600)
    assert {(m.uid, m.gid) for m in tree.values()} == {(7, 8)}


def test_reroot_moves_everything_under_the_target_name() -> None:
    buf = io.BytesIO(tree_tar({"a/b.txt": (b"b", 0o640)}, owner=(5, 5), root_mode=0o711))
    with tarfile.open(fileobj=buf, mode="a") as tf:
        link = tarfile.TarInfo("a/hard")
        link.type, link.linkname = tarfile.LNKTYPE, "a/b.txt"
        tf.addfile(link)
    archive = buf.getvalue()
    moved = _members(reroot(archive, "app"))
    assert set(moved) == {"app", "app/a", "app/a/b.txt", "app/a/hard"}
    assert (moved["app"].mode, moved["app"].uid, moved["app/a/b.txt"].mode) == (0o711, 5, 0o640)
    assert moved["app/a/hard"].linkname == "app/a/b.txt"
    with tarfile.open(fileobj=io.BytesIO(reroot(archive, "app"))) as tf:
        f = tf.extractfile("app/a/b.txt")
        assert f is not None and f.read() == b"b"
    with pytest.raises(ValueError):
        reroot(archive, "../up")
