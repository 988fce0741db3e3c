"""The bundled sample tasks (opencode_tui_core.samples): listed by name, found by ``run NAME``, copied without
overwriting anything. Runs against the checkout's real ``sample_tasks/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_tui_core.samples import copy_samples, find_sample, list_samples, resolve_task_ref, samples_root
from opencode_tui_core.tasks import load_task

REPO_SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def test_every_sample_directory_is_listed_by_its_name() -> None:
    assert samples_root() == REPO_SAMPLES
    names = [s.name for s in list_samples()]
    on_disk = sorted(
        p.parent.relative_to(REPO_SAMPLES).as_posix()
        for p in [*REPO_SAMPLES.rglob("task.yaml"), *REPO_SAMPLES.rglob("task.toml")]
    )
    assert names == on_disk
    assert {"hello-file", "oom", "harbor/hello-world"} <= set(names)
    hello = find_sample("hello-file")
    assert hello is not None and hello.summary.startswith("Create a file named hello.txt")
    assert load_task(hello.path).id == "hello-file"


def test_a_name_finds_the_bundled_sample_but_a_directory_here_wins(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    ref = resolve_task_ref("hello-file")
    assert ref.sample is not None and ref.path == REPO_SAMPLES / "hello-file"
    (tmp_path / "hello-file").mkdir()
    ref = resolve_task_ref("hello-file")
    assert ref.sample is None and ref.path == Path("hello-file") and ref.shadowed is not None
    unknown = resolve_task_ref("no-such-sample")
    assert unknown.sample is None and unknown.shadowed is None and not unknown.path.exists()


def test_copy_takes_all_or_the_named_and_never_overwrites(tmp_path) -> None:
    copied = copy_samples(tmp_path / "all")
    assert [p.relative_to(tmp_path / "all").as_posix() for p in copied] == [s.name for s in list_samples()]
    assert (tmp_path / "all" / "fix-bug" / "files" / "calc.py").read_bytes() == (
        REPO_SAMPLES / "fix-bug" / "files" / "calc.py"
    ).read_bytes()
    assert not list((tmp_path / "all").rglob("__pycache__"))

    [one] = copy_samples(tmp_path / "some", ["harbor/hello-world"])
    assert (one / "task.toml").is_file()
    (one / "instruction.md").write_text("mine")
    with pytest.raises(FileExistsError, match="nothing was copied"):
        copy_samples(tmp_path / "some", ["hello-file", "harbor/hello-world"])
    assert (one / "instruction.md").read_text() == "mine"
    assert not (tmp_path / "some" / "hello-file").exists()
    with pytest.raises(ValueError, match="no bundled sample named 'nope'"):
        copy_samples(tmp_path / "other", ["nope"])
