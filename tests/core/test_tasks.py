"""Task file format: validation of workdir, references, prompt rendering."""

import pytest

from opencode_tui_core.config import ConfigError
from opencode_tui_core.tasks import Task, load_task, parse_memory, render_prompt

BASE = {"id": "t1", "problem_statement": "Do it.", "verify": {"command": "true"}}


@pytest.mark.parametrize("workdir", ["/", "/tmp", "app", "/app/../etc", "/tmp/"])
def test_invalid_workdirs_rejected(workdir):
    with pytest.raises(ValueError, match="workdir"):
        Task.model_validate({**BASE, "workdir": workdir})


@pytest.mark.parametrize("workdir", ["/app", "/work/repo", "/tmp/x"])
def test_valid_workdirs(workdir):
    assert Task.model_validate({**BASE, "workdir": workdir}).workdir == workdir


def test_prompt_has_all_three_sections():
    t = Task.model_validate({**BASE, "requirements": "Use stdlib.", "interface": "def f(x) -> int"})
    p = render_prompt(t)
    assert p.index("## Problem statement") < p.index("## Requirements") < p.index("## Interface")
    assert "Use stdlib." in p and "def f(x) -> int" in p


def test_load_task_errors_name_file_and_field(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_task(tmp_path / "nope")
    (tmp_path / "task.yaml").write_text('id: x\nproblem_statement: y\nverify: {command: "true"}\nbogus: 1\n')
    with pytest.raises(ConfigError) as err:
        load_task(tmp_path)
    assert "task.yaml" in str(err.value) and "bogus" in str(err.value)
    (tmp_path / "task.yaml").write_text(
        'id: x\nproblem_statement: y\nverify: {command: "true"}\nfiles: files\n'
    )
    with pytest.raises(ConfigError, match="files"):
        load_task(tmp_path)
    (tmp_path / "task.yaml").write_text("id: [x\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_task(tmp_path)


@pytest.mark.parametrize(
    ("text", "n"), [("64m", 64 << 20), ("1g", 1 << 30), ("512MiB", 512 << 20), (4096, 4096)]
)
def test_parse_memory(text, n):
    assert parse_memory(text) == n


def test_parse_memory_rejects_garbage():
    with pytest.raises(ValueError):
        parse_memory("lots")
