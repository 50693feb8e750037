"""A training run across jobs, on the local launcher: checkpoints where the spec says, one live
job at a time writing them, a later job going on from them; and each job's status in SLURM's
words, ``cluster wait``'s exit status, a job whose launcher died."""

import json
import os
import signal
from pathlib import Path

import pytest

from cluster.api import SweepJob
from cluster.system.poll import wait_until
from tests.conftest import ROOT, run_module
from tests.support.jobs import cancel, submit, wait_for_line, wait_for_step, wait_nothing_left
from train.contract.protocol import CHECKPOINTS, read_records

pytestmark = pytest.mark.slow
SMALL = ["tasks_per_node=2", "train.batch_size=32", "train.log_every=10", "train.eval_every=1000"]


def status_of(job_dir) -> dict:
    result = run_module("cluster", "status", str(job_dir), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def waited(job_dir) -> int:
    return run_module("cluster", "wait", str(job_dir), "--json", timeout=300).returncode


def test_checkpoints_go_where_the_spec_says_one_live_job_writes_them_and_the_next_goes_on(tmp_path):
    """checkpoint_dir: the built-in trainer's checkpoints are there, none in the job directory. A
    second job submitted there while the first runs exits 2 naming it, and submits nothing;
    once the first is cancelled (CANCELLED), a job there resumes from its latest checkpoint and
    trains on to its own last step (COMPLETED, ``cluster wait`` exits 0)."""
    scratch, runs = tmp_path / "scratch", tmp_path / "runs"
    where = [f"checkpoint_dir={scratch}", "train.ckpt_every=10", *SMALL]
    result, first = submit("jobs/local.yaml", runs, *where, "train.steps=100000", wait=False)
    assert result.returncode == 0, result.stderr
    first_dir = runs / "local" / first["job_id"]
    wait_for_step(first_dir, 0, 20)
    refused, _ = submit("jobs/local.yaml", runs, *where, "train.steps=40")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"checkpoint_dir: {scratch} is written by job {first['job_id']}" in refused.stderr, refused.stderr
    assert sorted(p.name for p in (runs / "local").iterdir()) == [first["job_id"]]  # nothing submitted
    assert status_of(first_dir)["state"] == "RUNNING"
    cancel(first_dir)
    assert status_of(first_dir)["state"] == "CANCELLED"
    latest = int((scratch / "latest").read_text().strip().removeprefix("step_"))
    assert latest >= 20 and not (first_dir / "checkpoints").exists()
    result, second = submit("jobs/local.yaml", runs, *where, f"train.steps={latest + 20}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    second_dir = runs / "local" / second["job_id"]
    log = (second_dir / "rank_00000.log").read_text()
    assert f"resumed from {scratch}/step_{latest:07d} (step {latest})" in log, log[-2000:]
    assert status_of(second_dir)["state"] == "COMPLETED" and waited(second_dir) == 0
    assert (scratch / "latest").read_text().strip() == f"step_{latest + 20:07d}"


def test_status_and_wait_say_how_a_job_ended_and_a_lost_launcher_is_told(tmp_path):
    """A rank that raises: FAILED naming it, ``cluster wait`` exits 1. A script of one's own
    saves where KIT_CHECKPOINT_DIR says (jobs/train_cnn.py). A job whose launcher is killed:
    UNWATCHED while its ranks run on, not RUNNING; ``cluster cancel`` ends them, CANCELLED."""
    runs = tmp_path / "runs"
    result, failed = submit("jobs/local.yaml", runs, *SMALL, "train.steps=40", "train.fail_at_step=15",
                            "train.fail_rank=1", wait=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    scratch = tmp_path / "cnn-scratch"
    cnn = ["cluster=local", "nodes=1", "gpus_per_node=0", "tasks_per_node=2", f"checkpoint_dir={scratch}",
           'program.args=["--steps", "30", "--log-every", "10", "--ckpt-every", "10"]']  # fmt: skip
    result, script = submit("jobs/cnn.yaml", runs, *cnn, wait=False)
    assert result.returncode == 0, result.stderr
    result, lost = submit("jobs/local.yaml", runs, *SMALL, "train.steps=100000", wait=False)
    assert result.returncode == 0, result.stderr
    failed_dir, lost_dir = runs / "local" / failed["job_id"], runs / "local" / lost["job_id"]

    assert waited(failed_dir) == 1
    status = status_of(failed_dir)
    assert (status["state"], status["culprit"]["rank"]) == ("FAILED", 1), status
    assert "train.fail_at_step=15 on rank 1" in status["reason"]
    first = json.loads(run_module("cluster", "logs", str(failed_dir), "--json").stdout)["first_failure"]
    assert (first["rank"], first["step"], first["last_step"]) == (1, 15, 10), first  # in step 15; logged 10
    assert "in step 15" in run_module("cluster", "logs", str(failed_dir)).stdout
    ended = run_module("cluster", "cancel", str(failed_dir))  # nothing to cancel: it says so, and changes nothing
    assert ended.returncode == 0 and "has already ended (FAILED): nothing to cancel" in ended.stdout, ended.stdout
    assert status_of(failed_dir)["state"] == "FAILED"
    assert waited(runs / "cnn" / script["job_id"]) == 0 and (scratch / "cnn.pt").is_file()

    wait_for_step(lost_dir, 0, 10)
    os.kill(int(lost["job_id"]), signal.SIGKILL)  # the launcher's controller: its pid is the job id
    wait_until(lambda: status_of(lost_dir)["state"] != "RUNNING", 60, "the status to see the launcher gone")
    status = status_of(lost_dir)
    assert status["state"] == "UNWATCHED" and "cluster-kit cancel" in status["reason"], status
    still = run_module("cluster", "wait", str(lost_dir), "--timeout", "1")
    assert still.returncode == 124 and "still UNWATCHED" in still.stderr, still.stderr
    cancel(lost_dir)
    assert status_of(lost_dir)["state"] == "CANCELLED"
    wait_nothing_left(lost_dir)
    # killed while its ranks start up, before any wrote its start record: UNWATCHED all the same
    # (the launcher's account names its tasks), and its checkpoint directory still taken
    where = f"checkpoint_dir={tmp_path / 'young'}"
    result, young = submit("jobs/local.yaml", runs, *SMALL, "train.steps=100000", where, wait=False)
    assert result.returncode == 0, result.stderr
    young_dir = runs / "local" / young["job_id"]
    wait_for_line(young_dir / "controller.log", "task 1: pid")
    os.kill(int(young["job_id"]), signal.SIGKILL)
    assert status_of(young_dir)["state"] == "UNWATCHED"
    refused, _ = submit("jobs/local.yaml", runs, *SMALL, where)
    assert refused.returncode == 2 and f"is written by job {young['job_id']}" in refused.stderr, refused.stderr
    cancel(young_dir)
    assert status_of(young_dir)["state"] == "CANCELLED"
    wait_nothing_left(young_dir)


def final(job_dir) -> dict:
    return [r for r in read_records(job_dir / "rank_00000.jsonl") if r.get("final")][-1]


def resumed(job_dir, *extra: str):
    result = run_module("cluster", "resume", str(job_dir), "--json", *extra, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return result, (json.loads(lines[0]) if lines else None)


def test_a_cancelled_run_resumed_in_a_new_job_ends_as_if_never_stopped(tmp_path):
    """jobs/local.yaml cancelled past its step-60 checkpoint, which is then damaged, and ``cluster
    resume``: job 2 of the run passes it over for the one before, goes on from there, and its
    last losses equal, bit for bit, those of
    the same run never stopped (the trainer's data order and state follow the step). Refused
    with exit 2 and nothing submitted: a resume of the job while it runs, of a directory that
    is no job, of a job that left no checkpoint, and a second resume while the first runs."""
    runs = tmp_path / "runs"
    run = [*SMALL, "train.steps=120", "train.ckpt_every=30"]
    result, straight = submit("jobs/local.yaml", tmp_path / "straight", *run, wait=False)
    assert result.returncode == 0, result.stderr
    # rank 1 hangs at step 70 (after the step-60 checkpoint): the job runs until it is cancelled
    result, first = submit("jobs/local.yaml", runs, *run, "train.hang_at_step=70", "train.hang_rank=1", wait=False)
    assert result.returncode == 0, result.stderr
    result, early = submit("jobs/local.yaml", runs, *run, "train.fail_at_step=5", wait=False)
    assert result.returncode == 0, result.stderr
    first_dir = runs / "local" / first["job_id"]
    wait_for_step(first_dir, 0, 60)
    running, _ = resumed(first_dir)
    assert running.returncode == 2 and "is still RUNNING" in running.stderr, running.stderr
    assert waited(runs / "local" / early["job_id"]) == 1
    cancel(first_dir)
    logs = run_module("cluster", "logs", str(first_dir), "--json")
    report = json.loads(logs.stdout)  # a cancel is someone's decision: no rank failed
    assert logs.returncode == 0 and report["first_failure"] is None, logs.stdout[-3000:]
    assert {r["state"] for r in report["ranks"]} == {"cancelled"}
    for bad, words in ((tmp_path, "not a job directory"), (runs / "local" / early["job_id"], "has no checkpoint")):
        refused, _ = resumed(bad)
        assert refused.returncode == 2 and words in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    # rank 1's part of the latest checkpoint is cut short (a bad copy, a disk that filled): every
    # rank passes it over together for the step-30 one, and says so
    shard = first_dir / CHECKPOINTS / "step_0000060" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    result, second = resumed(first_dir, "train.hang_at_step=null", "--wait")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert second["run"]["job"] == 2 and second["run"]["from_step"] == 60, second
    log = (Path(second["log_dir"]) / "rank_00000.log").read_text()
    assert "step_0000060 does not load" in log and "step_0000030 (step 30)" in log, log[-3000:]
    # the run's checkpoints are free again once job 2 ended; job 3 trains on, and hangs until cancelled
    again, third = resumed(first_dir, "train.steps=1000", "train.hang_at_step=130")
    assert again.returncode == 0, again.stderr
    twice, _ = resumed(first_dir, "train.steps=1000")
    assert twice.returncode == 2 and f"is written by job {third['job_id']}" in twice.stderr, twice.stderr
    assert third["run"]["from_step"] == 120
    cancel(Path(third["log_dir"]))
    assert sorted(p.name for p in (runs / "local").iterdir()) == sorted([first["job_id"], early["job_id"],
                                                                       second["job_id"], third["job_id"]])  # fmt: skip
    assert waited(tmp_path / "straight" / "local" / straight["job_id"]) == 0
    reference = final(tmp_path / "straight" / "local" / straight["job_id"])
    ended = final(Path(second["log_dir"]))
    assert ended["step"] == 120 and (ended["train_loss"], ended["test_loss"]) == (
        reference["train_loss"],
        reference["test_loss"],
    )
    status = status_of(second["log_dir"])
    assert status["state"] == "COMPLETED" and status["run"]["id"] == status_of(first_dir)["run"]["id"], status
    # The run is one thing to look at: one series per metric across its three jobs, each step
    # once (a job's steps past the checkpoint the next one loaded are the later job's), equal to
    # the run never stopped; its page and TensorBoard's events say the same.
    run_id = status["run"]["id"]
    shown = run_module("cluster", "logs", run_id, "--log-dir", str(runs), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert [j["from_step"] for j in report["jobs"]] == [None, 30, 120]  # job 2 loaded step 30, not the damaged 60
    assert [b["step"] for b in report["boundaries"]] == [30, 120]
    page = run_module("cluster", "page", run_id, "--log-dir", str(runs), "--json")
    assert page.returncode == 0, page.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(json.loads(page.stdout)["tensorboard"])
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("metrics/train_loss")]
    steps = [step for step, _ in losses]
    assert steps == list(range(10, steps[-1] + 1, 10)) and steps[-1] >= 120, steps
    never_stopped = {r["step"]: r["train_loss"] for r in read_records(
        tmp_path / "straight" / "local" / straight["job_id"] / "rank_00000.jsonl") if r["event"] == "step"}  # fmt: skip
    assert [(s, v) for s, v in report["series"]["train_loss"] if s <= 120] == [(s, never_stopped[s]) for s in steps
                                                                               if s <= 120]  # fmt: skip
    assert all(abs(v - never_stopped[s]) < 1e-6 for s, v in losses if s <= 120)  # TensorBoard keeps float32
    listed = run_module("cluster", "runs", "--log-dir", str(runs), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["run"]: r for r in json.loads(listed.stdout)}
    assert (rows[run_id]["jobs"], rows[run_id]["state"]) == (3, "CANCELLED") and len(rows) == 2, rows
    failed = run_module("cluster", "runs", "--log-dir", str(runs), "--state", "failed", "--since", "1h", "--json")
    (only,) = json.loads(failed.stdout)
    assert only["job_dirs"] == [str(runs / "local" / early["job_id"])] and "fail_at_step=5" in only["culprit"], only


def test_until_done_resumes_the_run_after_each_stop_short_of_its_last_step(tmp_path):
    """``submit --until-done`` with a time limit whose signal comes 5 s after each job starts,
    before its ranks' first step: the ranks agree on it at their next log step (every 100), save
    and stop there, and the run goes on in a new job from that checkpoint until its last step,
    300: three jobs. Its last losses equal those of the same run never stopped. Beside it, a
    sweep of two points ``--until-done`` under the same limit: each point a run of two jobs to
    its last step, 200, its table completed."""
    run = [*SMALL, "train.steps=300", "train.log_every=100"]
    result, straight = submit("jobs/local.yaml", tmp_path / "straight", *run, wait=False)
    assert result.returncode == 0, result.stderr
    swept = run_module("cluster", "sweep", "jobs/local.yaml", f"log_dir={tmp_path / 'sweep'}", *SMALL, "time=1",
                       "signal=USR1@55", "train.steps=200", "train.log_every=100", "optim.lr=0.05,0.1",
                       "--max-parallel", "2", "--until-done", "--json")  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    sweep_dir = json.loads(swept.stdout)["sweep_dir"]
    runs = tmp_path / "runs"
    result = run_module("cluster", "submit", "jobs/local.yaml", f"log_dir={runs}", *run, "time=1", "signal=USR1@55",
                        "--until-done", "--json", timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    first, last = (json.loads(line) for line in (result.stdout.splitlines()[0], result.stdout.splitlines()[-1]))
    jobs = sorted((p for p in (runs / "local").iterdir()), key=lambda p: status_of(p)["run"]["job"])
    assert len(jobs) == last["run"]["job"] >= 2 and jobs[0].name == first["job_id"] and jobs[-1].name == last["job_id"]
    assert {status_of(p)["run"]["id"] for p in jobs} == {last["run"]["id"]}  # one run
    for before, after in zip(jobs, jobs[1:], strict=False):
        stopped = [r for r in read_records(before / "rank_00000.jsonl") if r["event"] == "preempted"]
        assert stopped and status_of(after)["run"]["from_step"] == stopped[-1]["step"], (before, after)
        said = status_of(before)  # COMPLETED (every rank exited 0), and why it is not the end
        assert (
            said["state"] == "COMPLETED"
            and f"time-limit signal after a checkpoint at step {stopped[-1]['step']}" in said["reason"]
        )
    assert "the run reached its last step" in result.stderr
    assert waited(tmp_path / "straight" / "local" / straight["job_id"]) == 0
    reference, ended = final(tmp_path / "straight" / "local" / straight["job_id"]), final(jobs[-1])
    assert ended["step"] == 300 and (ended["train_loss"], ended["test_loss"]) == (
        reference["train_loss"],
        reference["test_loss"],
    )
    table = SweepJob.attach(sweep_dir).wait(timeout=600)
    assert [row["state"] for row in table["points"]] == ["completed", "completed"], table
    for row in table["points"]:
        point = status_of(row["job_dir"])["run"]
        assert (point["job"], point["from_step"]) == (2, 100), point  # stopped at its first log step, then done
        assert final(Path(row["job_dir"]))["step"] == 200
    runner_log = (Path(sweep_dir) / "runner.log").read_text()
    assert runner_log.count("short of its last step; submitted job") == 2, runner_log


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_your_own_script_goes_on_until_done_from_where_it_stopped_at_the_signal(tmp_path, launcher):
    """jobs/train_cnn.py, unchanged, ``--until-done`` with a time-limit signal 5 s into each job:
    the script agrees on it at its next log step (2000: more than 5 s of steps), saves in
    KIT_CHECKPOINT_DIR and exits 0; the kit, having seen the signal come, takes that for a stop
    short of the end and resumes the run, which goes on from the script's own checkpoint to its
    last step (4000). The job that finds nothing left to do ends the chain."""
    scratch = tmp_path / "scratch"
    cnn = ["cluster=local", "nodes=1", "gpus_per_node=0", "tasks_per_node=2", f"program.launcher={launcher}",
           f"checkpoint_dir={scratch}", "time=1", "signal=USR1@55", "requeue=false",
           'program.args=["--steps", "4000", "--log-every", "2000", "--ckpt-every", "2000"]']  # fmt: skip
    result = run_module("cluster", "submit", "jobs/cnn.yaml", f"log_dir={tmp_path / 'runs'}", *cnn, "--until-done",
                        "--json", timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    jobs = sorted((tmp_path / "runs" / "cnn").iterdir(), key=lambda p: status_of(p)["run"]["job"])
    logs = [(job / "rank_00000.log").read_text() for job in jobs]
    assert "stopping at step 2000" in logs[0], logs[0][-2000:]
    assert f"resumed from {scratch}/cnn.pt at step 2000" in logs[1], logs[1][-2000:]
    assert "step 4000/4000" in logs[1] and "step 4000/4000" not in "".join(logs[2:])
    assert len(jobs) <= 3 and {status_of(j)["run"]["id"] for j in jobs} == {status_of(jobs[0])["run"]["id"]}
    assert "the run reached its last step" in result.stderr, result.stderr[-2000:]


def test_a_project_of_ones_own_with_a_relative_log_dir_has_its_metrics_and_its_runs_listed(tmp_path):
    """A project outside the kit (a script the kit never saw, a spec beside it, ``log_dir: runs``
    relative to it), submitted from its own folder: the ranks' printed ``step N loss X`` lines
    become metrics (their files in the job's folder, not beside the kit), and ``cluster runs``
    there shows the run's step and loss. The script submitted alone, no YAML, is a job too."""
    (tmp_path / "my_train.py").write_text((ROOT / "jobs" / "train_cnn.py").read_text())
    (tmp_path / "my_job.yaml").write_text(
        "name: mine\ncluster: local\nnodes: 1\ntasks_per_node: 2\nlog_dir: runs\n"
        'program:\n  script: my_train.py\n  args: ["--steps", "40", "--log-every", "10", "--ckpt", ""]\n'
    )
    done = run_module("cluster", "submit", "my_job.yaml", "--wait", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (job_dir,) = (tmp_path / "runs" / "mine").iterdir()
    assert (job_dir / "rank_00000.metrics.jsonl").is_file()
    listed = run_module("cluster", "runs", "--json", cwd=tmp_path)
    (row,) = json.loads(listed.stdout)
    assert row["step"] == 40 and row["loss"] is not None and row["state"] == "COMPLETED", row
    # the script alone is a job too: the spec's defaults, SLURM's and torchrun's flags, its arguments after --
    bare = run_module("cluster", "submit", "my_train.py", "--cluster", "local", "--nproc-per-node", "2", "--wait",
                      "--json", "--", "--steps", "20", "--log-every", "10", "--ckpt", "", cwd=tmp_path)  # fmt: skip
    assert bare.returncode == 0, bare.stdout[-2000:] + bare.stderr[-2000:]
    job_dir = tmp_path / json.loads(bare.stdout.splitlines()[0])["log_dir"]  # as given: relative to where it ran
    assert job_dir.parent == tmp_path / "runs" / "my_train" and "step 20/20" in (job_dir / "rank_00000.log").read_text()
    assert json.loads((job_dir / "plan.json").read_text())["world_size"] == 2
