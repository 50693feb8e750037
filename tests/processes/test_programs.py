"""A user's own program under the kit: the program: section, its request, and real local jobs
of jobs/train_cnn.py (a script written for torchrun that knows nothing of the kit)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.system.poll import wait_until
from tests.conftest import ROOT, run_module
from tests.support.jobs import cancel, job_running, logs_json, submit, wait_for_line
from tests.support.programs import CNN

# ----------------------------------------------------------------------------- real local jobs
FAST = ["tasks_per_node=2", "stall_timeout_s=20"]


def cnn_job(tmp_path, *args: str, extra=(), wait=True):
    program = [CNN, f"program.args={json.dumps(['--steps', '40', '--log-every', '10', *args])}"]
    return submit("jobs/local.yaml", tmp_path, *FAST, *program, *extra, wait=wait)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_your_own_script_runs_to_the_end_with_a_log_and_progress_per_rank(launcher, tmp_path):
    result, info = cnn_job(tmp_path, extra=[f"program.launcher={launcher}"])
    assert result.returncode == 0, result.stdout + result.stderr
    job_dir = Path(info["log_dir"])
    code, report = logs_json(job_dir)
    assert code.returncode == 0 and [r["state"] for r in report["ranks"]] == ["completed"] * 2
    assert all(r["last_step"] == 40 for r in report["ranks"])  # from the optimizer-step hook
    for rank in range(2):
        text = (job_dir / f"rank_{rank:05d}.log").read_text()
        assert f"env RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0" in text
        assert text[:4].isdigit()  # every line stamped
    assert (job_dir / "node_00000.log").exists() == (launcher == "torchrun")


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["program.module=jobs.train_cnn", "program.function=jobs.train_cnn:main"], ids=["module", "function"]
)
def test_modules_and_functions_run_too(kind, tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, *FAST, kind, "program.launcher=per_task")
    assert result.returncode == 0, result.stdout + result.stderr
    code, report = logs_json(Path(info["log_dir"]))
    assert report["completed"] == 2 and all(r["last_step"] == 200 for r in report["ranks"])


@pytest.mark.slow
def test_a_raising_rank_of_the_script_is_the_first_failure(tmp_path):
    result, info = cnn_job(tmp_path, "--fail-at-step", "20", "--fail-rank", "1", extra=["tasks_per_node=3"])
    assert result.returncode == 1
    code, report = logs_json(Path(info["log_dir"]))
    first = report["first_failure"]
    assert code.returncode == 1 and first["rank"] == 1 and "--fail-at-step 20 on rank 1" in first["error"]
    assert any("train_cnn.py" in frame for frame in first["frames"])


@pytest.mark.slow
def test_a_hanging_rank_of_the_script_is_named_by_snapshot_then_by_the_watchdog(tmp_path):
    result, info = cnn_job(tmp_path, "--hang-at-step", "20", "--hang-rank", "1", extra=["tasks_per_node=3"], wait=False)
    assert result.returncode == 0, result.stderr
    job_dir = Path(info["log_dir"])
    try:
        wait_for_line(job_dir / "rank_00001.log", "rank 1 hangs at step 20")
        snap = run_module("cluster", "stacks", str(job_dir), "--json")
        assert snap.returncode == 0 and json.loads(snap.stdout)["culprits"] == [1], snap.stdout + snap.stderr
        # then the stall watchdog (20 s) ends the job by itself
        wait_until(lambda: not job_running(job_dir), 180, "the watchdog to end the job")
        code, report = logs_json(job_dir)
    finally:
        cancel(job_dir)
    assert report["hang"]["culprits"] == [1] and report["first_failure"]["rank"] == 1
    assert "train_cnn.py" in report["first_failure"]["error"]


@pytest.mark.slow
def test_a_script_that_exits_0_without_training_is_a_failure_unless_told_otherwise(tmp_path):
    result, info = cnn_job(tmp_path, "--exit-without-training")
    assert result.returncode == 1  # submit --wait
    code, report = logs_json(Path(info["log_dir"]))
    assert code.returncode == 1 and {r["state"] for r in report["ranks"]} == {"no_progress"}
    assert "completed without training progress" in run_module("cluster", "logs", info["log_dir"]).stdout
    result, info = cnn_job(tmp_path, "--exit-without-training", extra=["program.require_progress=false"])
    assert result.returncode == 0 and logs_json(Path(info["log_dir"]))[1]["completed"] == 2


USERS_SCRIPT = """
import train, cluster  # the user's own modules, beside this script
import torch
assert (train.WHO, cluster.WHO) == ("user", "user"), (train.__file__, cluster.__file__)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(8, 4)).sum().backward()
opt.step()
print("trained with", train.__file__)
"""


@pytest.mark.slow
def test_a_users_train_py_and_cluster_py_neither_shadow_nor_are_shadowed(tmp_path):
    """From a directory with the user's own train.py and cluster.py: the kit's command, the
    built-in trainer and the user's script (which imports its own train and cluster) all run."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("train.py", "cluster.py"):
        (work / name).write_text('WHO = "user"\n')
    (work / "my_script.py").write_text(USERS_SCRIPT)
    kit = str(Path(sys.executable).parent / "cluster-kit")
    for args in (["program.script=my_script.py"], ["train.steps=20", "train.log_every=10"]):
        done = subprocess.run([kit, "submit", str(ROOT / "jobs/local.yaml"), "tasks_per_node=2", f"log_dir={tmp_path}",
                               "--wait", *args], cwd=work, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "world size 2: 2 completed" in done.stdout
