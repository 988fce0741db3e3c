"""The kernel's ``oom-kill:`` record as /dev/kmsg gives it (the line below was read on this machine after
a real OOM kill in a test cgroup), and the reader's behaviour where the log cannot be read."""

from __future__ import annotations

from opencode_tui_core.sandbox.kernel_log import KernelLog, parse_record

RECORD = (
    "3,1234,301127198,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/oomprobe17495,task_memcg=/oomprobe17495,task=python3,pid=22649,uid=0\n"
)


def test_an_oom_kill_record_names_the_pid_the_task_and_the_cgroup():
    rec = parse_record(RECORD)
    assert rec is not None
    assert (rec.pid, rec.task, rec.task_memcg, rec.oom_memcg, rec.uid) == (
        22649,
        "python3",
        "/oomprobe17495",
        "/oomprobe17495",
        0,
    )
    assert rec.in_cgroup("/oomprobe17495") and rec.in_cgroup("oomprobe17495/")
    assert not rec.in_cgroup("/oomprobe1749")  # a prefix of another cgroup's name is not it


def test_other_records_are_not_kills():
    assert parse_record("6,1,2,-;Memory cgroup out of memory: Killed process 22649 (python3)\n") is None
    assert parse_record("no separator") is None


def test_an_unreadable_log_says_why_and_yields_nothing(tmp_path):
    log = KernelLog(str(tmp_path / "missing"))
    assert log.error and "not readable" in log.error
    assert log.oom_kills() == []
