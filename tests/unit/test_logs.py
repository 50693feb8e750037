"""The log inspector on synthetic job directories (real failures are in test_local_jobs/test_slurm)."""

import os

import pytest

from cluster.jobdir import JobDir
from cluster.logs.parallel import forked_map
from cluster.logs.scan import parse_traceback
from cluster.logs.stacks import compress
from cluster.logs.text import format_report
from cluster.logs.triage import inspect
from fixtures.synthetic import START, make_job, stamp
from tests.conftest import run_module
from train.contract.protocol import RECENT_BYTES, RecordWriter, read_records, recent_records, record_name


def test_crash_names_first_rank_by_time_and_groups_the_cascade(tmp_path):
    report = inspect(make_job(tmp_path, world=8, crash_rank=5), running=False)
    f = report.first_failure
    assert (f["rank"], f["node"], f["gpu"]) == (5, 1, 1)
    assert "illegal memory access" in f["error"]
    assert f["frames"] and "project/train/loop.py" in f["frames"][0]
    assert report.cascade == {"Connection closed by peer": [0, 1, 2, 3, 4, 6, 7]}


def test_silent_rank_is_the_suspect_of_a_hang(tmp_path):
    job = make_job(tmp_path, world=4, lines=100, silent_rank=2)
    # Ranks 0, 1, 3 still write (their last line is at START+99); rank 2 stopped at START+49.
    report = inspect(job, running=True, silent_after_s=30, now=START + 100)
    states = [r.state for r in report.ranks]
    assert states[2] == "silent" and report.first_failure["rank"] == 2
    assert "silent since" in report.first_failure["error"]
    assert report.failed is False  # a hang is not (yet) a failure


def test_straggler_is_flagged(tmp_path):
    report = inspect(make_job(tmp_path, world=6, slow_rank=4), running=False, straggler_margin=0.2)
    assert report.stragglers == [4] and report.first_failure is None
    assert all(r.state == "completed" for r in report.ranks)


def write_long_run(run_dir, rank: int, steps: int, then: tuple[tuple[str, dict], ...] = ()) -> None:
    """A long run's records, by the ranks' own writer (its format is what the byte search reads):
    an attempt of ``steps`` step records (days of them, at one every 5 s), then ``then``."""
    writer = RecordWriter(run_dir, rank)
    writer.write("start", pid=1)
    for step in range(1, steps + 1):
        writer.write("step", step=step, step_ms=10.0, train_loss=None, samples_per_s=None)
    for event, fields in then:
        writer.write(event, **fields)
    writer.close()


def test_a_long_runs_records_are_read_from_their_end(tmp_path):
    """Not every record of days of them: the last RECENT_BYTES' worth, the last attempt's start
    and the last step written before those, in the file's order; a short file whole."""
    # A second attempt that failed at once, in words that spell a start record, and saved a lot.
    second = (("start", {"pid": 2}), ("failed", {"step": 3000, "error": 'ValueError: {"event": "start"}'}),
              *(("checkpoint", {"step": 3000, "seconds": 0.5}) for _ in range(2000)))  # fmt: skip
    write_long_run(tmp_path, 0, 3000, second)
    path = tmp_path / record_name(0)
    assert path.stat().st_size > 4 * RECENT_BYTES
    everything = list(read_records(path))
    recent = recent_records(path)
    # No step and no start among the last records (checkpoints): both are found before them.
    assert [r["event"] for r in recent[:2]] == ["step", "start"] and recent[0]["step"] == 3000
    assert recent[1]["pid"] == 2  # the last attempt's start, not the failed record after it
    assert recent[2:] == everything[-len(recent) + 2 :] and len(recent) < len(everything) / 4
    write_long_run(tmp_path / "short", 0, 10)
    assert recent_records(tmp_path / "short" / record_name(0)) == list(
        read_records(tmp_path / "short" / record_name(0))
    )


def test_a_long_runs_rank_stands_as_its_every_record_says(tmp_path):
    """inspect reads a long run's records from their end; with --plot's step times it reads them
    all: both give each rank the same state, last step, error and times."""
    job = make_job(tmp_path, world=4, crash_rank=1)
    write_long_run(job, 2, 5000, (("end", {"exit_code": 0, "steps": 5000}),))
    fields = lambda r: {k: v for k, v in r.__dict__.items() if k != "log"}  # noqa: E731
    recent, whole = inspect(job, running=False), inspect(job, running=False, step_times=True)
    assert [fields(r) for r in recent.ranks] == [fields(r) for r in whole.ranks]
    assert (recent.ranks[2].state, recent.ranks[2].last_step) == ("completed", 5000)
    assert recent.first_failure == whole.first_failure and recent.first_failure["rank"] == 1


def test_parse_traceback_keeps_user_frames_only():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/torch/nn/module.py", line 1, in __call__\n    return f()\n'
        '  File "/home/me/model.py", line 7, in forward\n    x = self.bad(x)\n'
        "ValueError: shapes do not match\n"
    )
    error, frames = parse_traceback(text)
    assert error == "ValueError: shapes do not match"
    assert frames == ['File "/home/me/model.py", line 7, in forward\n    x = self.bad(x)']


def test_a_frame_without_its_source_line_takes_no_other_line_for_it():
    """Where Python has no source (a function shipped by value, a file not on the node), the
    line after a frame is the next frame or the exception: never shown as the frame's code."""
    text = 'Traceback (most recent call last):\n  File "<dynamic-code>", line 24, in boom\nRuntimeError: boom\n'
    assert parse_traceback(text) == ("RuntimeError: boom", ['File "<dynamic-code>", line 24, in boom'])


def test_compress():
    assert compress([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_triage_of_many_ranks(tmp_path):
    """The benchmark's synthetic job, scaled down (its speed against grep is the benchmark's:
    docs/benchmarks.md); 256 ranks take the multi-process path where there are 2 cores."""
    job = make_job(tmp_path, world=256, lines=1000, crash_rank=77)
    report = inspect(job, running=False)
    assert [r.rank for r in report.ranks] == list(range(256))
    assert report.first_failure["rank"] == 77
    assert sorted(r for ranks in report.cascade.values() for r in ranks) == [r for r in range(256) if r != 77]


def test_a_forked_share_that_fails_is_done_here_and_no_child_is_left():
    parent = os.getpid()

    def square_here_only(chunk):
        if os.getpid() != parent:
            raise RuntimeError("a child's share fails")
        return [x * x for x in chunk]

    assert forked_map(square_here_only, [[1, 2], [3], [4, 5]]) == [[1, 4], [9], [16, 25]]
    with pytest.raises(ChildProcessError):  # every child waited for
        os.waitpid(-1, os.WNOHANG)


def finished_rank(job_dir, rank: int, log_tail: str = "") -> None:
    """A rank that wrote its final step record (and then ``log_tail`` to its log)."""
    from train.contract.protocol import RecordWriter

    writer = RecordWriter(job_dir, rank)
    writer.write("start", pid=1, env={"host": "h", "node_rank": 0})
    writer.write("step", step=10, train_loss=1.0, step_ms=1.0, final=True)
    writer.close()
    (job_dir / f"rank_{rank:05d}.log").write_text(f"{stamp(START)}step 10/10\n{log_tail}")


def test_a_crash_at_exit_after_the_final_record_is_not_a_failure(tmp_path):
    """gloo's threads can abort the interpreter's finalization after the work is done."""
    finished_rank(tmp_path, 0)
    finished_rank(tmp_path, 1, "terminate called without an active exception\n")
    report = inspect(tmp_path, running=False)
    assert [r.state for r in report.ranks] == ["completed", "completed"] and not report.failed
    assert report.ranks[1].exit_crash == "terminate called without an active exception"
    assert "rank 1 finished training, then crashed at exit" in format_report(report)


def test_a_rank_without_a_log_is_explained_by_the_schedulers_file(tmp_path):
    """A task that never started (its container image missing, say) wrote no log: what the
    batch script's output says of it is the error, not "never started"."""
    job_dir = tmp_path / "multi-node" / "4242"
    job_dir.mkdir(parents=True)
    finished_rank(job_dir, 1)
    (tmp_path / "multi-node" / "slurm-4242.log").write_text(
        "srun: error: n2: task 0: Exited with exit code 2\n"
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/torch/__init__.py", line 1, in <module>\n'
        "KeyboardInterrupt\n"
    )
    rank0 = inspect(job_dir, running=False).ranks[0]
    assert rank0.state == "killed" and "slurm-4242.log says: KeyboardInterrupt" in rank0.error
    assert rank0.log.endswith("slurm-4242.log")


def test_step_time_grid_has_a_row_per_rank_by_node_coloured_by_step_time(tmp_path):
    import math

    from cluster.views.charts import step_time_grid

    job = make_job(tmp_path, world=8, lines=100, silent_rank=5, slow_rank=2)
    order, grid, t0, t1 = step_time_grid(
        inspect(job, running=True, silent_after_s=30, now=START + 100, step_times=True)
    )
    assert [r.rank for r in order] == list(range(8)) and [r.node for r in order] == [0] * 4 + [1] * 4
    values = [{v for v in row if not math.isnan(v)} for row in grid]
    assert values[2] == {15.0} and all(values[r] == {10.0} for r in (0, 1, 3, 4, 6, 7))
    # The hung rank stops logging halfway: its row is empty (grey) from there on.
    assert math.isnan(grid[5][-len(grid[5]) // 3]) and not math.isnan(grid[4][-len(grid[4]) // 3])


def test_plot_of_1024_ranks_is_one_image_with_the_failure_marked(tmp_path):
    from cluster.views.charts import plot_step_times

    report = inspect(
        make_job(tmp_path / "job", world=1024, lines=50, crash_rank=341, tasks_per_node=8),
        running=False,
        step_times=True,
    )
    drawn = plot_step_times(report, tmp_path / "plot.png")
    assert drawn["rows"] == list(range(1024)) and drawn["failure"].startswith("first failure: rank 341 (failed)")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_a_restart_shows_as_a_gap_and_the_plot_marks_the_failure_and_the_restart(tmp_path):
    """Attempt 0 logs steps 20..120 (10 ms each) and fails; attempt 1 resumes from step 100
    eight seconds later. Between the two the rank trained nothing: its row is empty there."""
    import math

    from cluster.logs.report import RankReport, Report
    from cluster.views.charts import plot_step_times, step_time_grid

    times = [(s, 10.0, START + s / 100) for s in range(20, 121, 20)]
    times += [(s, 10.0, START + 9.0 + (s - 100) / 100) for s in range(120, 201, 20)]
    ranks = [RankReport(rank=r, node=r // 2, host=f"n{r // 2 + 1}", state="completed") for r in (0, 1)]
    attempts = [
        {"attempt": 0, "nodes": ["n1", "n2"], "started": START - 1, "verdict": "restart", "failed_at": START + 1.3,
         "rank": 1, "node": "n1", "excluded": [["n1", "the culprit's node"]]},
        {"attempt": 1, "nodes": ["n2", "n3"], "started": START + 2.0, "verdict": None},
    ]  # fmt: skip
    report = Report(
        str(tmp_path), 2, ranks, None, {}, [], False, attempts=attempts, restarts=1, step_times={0: times, 1: times}
    )
    order, grid, t0, t1 = step_time_grid(report, columns=100)
    at = lambda t: int((t - t0) / (t1 - t0) * 100)  # noqa: E731
    assert not math.isnan(grid[0][at(START + 1.1)]) and not math.isnan(grid[0][at(START + 9.1)])
    assert all(math.isnan(v) for v in grid[0][at(START + 1.3) : at(START + 8.8)])
    drawn = plot_step_times(report, tmp_path / "plot.png")
    assert drawn["rows"] == [0, 1] and drawn["failure"] is None
    assert drawn["attempts"] == ["attempt 0 failed: rank 1 on n1, n1 excluded", "restart 1 on n2,n3"]


TORCHRUN = {"program": {"launcher": "torchrun"}}
RESTARTED = "cluster.attempts: attempt 0 failed (exit 137; rank 2 on n2): ...\ncluster.attempts: restart 1 of 2 on n1,n3: restarting\n"


@pytest.mark.parametrize(
    "batch_log, plan, rank, node, want",
    [
        ("srun: error: n2: tasks 2-3: User defined signal 1\n", {"time_limit_signal": "USR1"}, 2, "n2",
         "killed by SIGUSR1: the spec's time-limit signal; the program has no handler"),
        ("srun: error: n1: task 0: User defined signal 2\n", {"time_limit_signal": "USR1"}, 0, "n1",
         "killed by SIGUSR2"),
        ("slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-11-24T10:00:00 DUE TO TIME LIMIT ***\n", {}, 3,
         "n2", "killed at the job's time limit"),
        ("srun: error: n1: task 0: Exited with exit code 1\n", {}, 0, "n1", ""),
        # The OOM killer's rank is "Killed"; srun then ends its peers: "Terminated" is theirs only
        ("srun: error: n2: task 2: Killed\nsrun: error: n1: tasks 0-1,3: Terminated\n", {}, 2, "n2",
         "killed by SIGKILL"),
        ("srun: error: n2: task 2: Killed\nsrun: error: n1: tasks 0-1,3: Terminated\n", {}, 3, "n2",
         "killed by SIGTERM: sent to the whole job (the step ended)"),
        # torchrun's agents are the tasks: the agent of n2 exited 1 (its workers were SIGKILLed),
        # srun then ended the agent of n1
        ("srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Terminated\n", TORCHRUN, 2,
         "n2", ""),
        ("srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Terminated\n", TORCHRUN, 0,
         "n1", "killed by SIGTERM: sent to the whole job (the step ended)"),
        # SLURM's words where the step's memory cgroup ran out (as users have reported them)
        ("slurmstepd: error: Detected 1 oom_kill event in StepId=12.0. Some of the step tasks have been OOM Killed.\n"
         "srun: error: n2: task 3: Out Of Memory\n", {}, 3, "n2",
         "killed for memory: the kernel's OOM killer, at the step's memory limit (spec mem)"),
        # the whole job cancelled: by a person, or by the scheduler for a reason it gives
        ("srun: got SIGCONT\nslurmstepd-n1: error: *** JOB 24 ON n1 CANCELLED AT 2026-11-25T20:17:56 ***\n"
         "srun: error: n1: tasks 0-1: Terminated\n", {}, 1, "n1",
         "cancelled at 2026-11-25T20:17:56 (scancel, or cluster cancel)"),
        ("slurmstepd: error: *** JOB 24 ON n1 CANCELLED AT 2026-11-25T20:17:56 DUE TO PREEMPTION ***\n", {}, 0, "n1",
         "cancelled at 2026-11-25T20:17:56 by the scheduler, due to preemption"),
        ("cluster.controller: cancelled (SIGTERM): ending the step\n", {}, 0, "local",
         "cancelled by cluster cancel (SIGTERM)"),
        # after a restart, what srun said of the attempts before is theirs
        ("srun: error: n2: tasks 2-3: Killed\n" + RESTARTED, {}, 2, "n3", ""),
        ("srun: error: n2: tasks 2-3: Killed\n" + RESTARTED + "srun: error: n3: task 2: Terminated\n", {}, 2, "n3",
         "killed by SIGTERM: sent to the whole job (the step ended)"),
    ],
)  # fmt: skip
def test_what_the_scheduler_says_ended_a_rank(batch_log, plan, rank, node, want, tmp_path):
    from cluster.logs.kills import scheduler_kill

    job_dir = tmp_path / "job" / "12"
    job_dir.mkdir(parents=True)
    (tmp_path / "job" / "slurm-12.log").write_text(batch_log)
    assert scheduler_kill(JobDir(job_dir), plan, JobDir(job_dir).names()).of(rank, node) == want


@pytest.mark.parametrize(
    "batch_log, cancelled",
    [("slurmstepd-n1: error: *** JOB 24 ON n1 CANCELLED AT 2026-11-25T20:17:56 ***\n", True),
     ("cluster.controller: cancelled (SIGTERM): ending the step\n", True),
     ("slurmstepd: error: *** JOB 24 ON n1 CANCELLED AT 2026-11-25T20:17:56 DUE TO PREEMPTION ***\n", False),
     ("slurmstepd: error: *** JOB 24 ON n1 CANCELLED AT 2026-11-25T20:17:56 DUE TO NODE FAILURE ***\n", False),
     ("slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-11-24T10:00:00 DUE TO TIME LIMIT ***\n", False)],
)  # fmt: skip
def test_a_job_cancelled_by_someone_is_told_from_one_the_scheduler_ended(batch_log, cancelled, tmp_path):
    """scancel or cluster cancel: the ranks it ended did not fail (cluster logs: cancelled, exit 0);
    the scheduler's own cancel (preemption, a node's failure) and the time limit are no one's decision."""
    from cluster.logs.kills import scheduler_kill

    job_dir = tmp_path / "job" / "12"
    job_dir.mkdir(parents=True)
    (tmp_path / "job" / "slurm-12.log").write_text(batch_log)
    assert scheduler_kill(JobDir(job_dir), {}, JobDir(job_dir).names()).cancelled == cancelled


AGENT_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_19:49:47
  host      : n2
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 5565)  (SIGKILL)
  error_file: <N/A>
"""


def test_a_torchrun_worker_killed_without_a_word_is_named_by_its_agents_account(tmp_path):
    """srun saw the agent of n2 exit 1 (not a signal): the agent's own report of attempt 1
    says its worker, rank 3, died of SIGKILL; attempt 0's ranks are not concerned."""
    from cluster.logs.kills import scheduler_kill

    job_dir = tmp_path / "job" / "12"
    job_dir.mkdir(parents=True)
    (tmp_path / "job" / "slurm-12.log").write_text("srun: error: n2: task 1: Exited with exit code 1\n")
    for name in ("node_00000.log", "node_00001.log", "node_00000.attempt1.log"):
        (job_dir / name).write_text("")
    (job_dir / "node_00001.attempt1.log").write_text(AGENT_REPORT)
    kills = scheduler_kill(JobDir(job_dir), TORCHRUN, JobDir(job_dir).names())
    assert kills.of(3, "n2", attempt=1) == "killed by SIGKILL (its torchrun agent's account)"
    assert kills.of(3, "n2", attempt=0) == "" and kills.of(2, "n2", attempt=1) == ""


def failing_rank(job_dir, before: str, after: str, progress_at: float) -> None:
    """A rank that started at START and last recorded progress at ``progress_at``: its log
    holds ``before`` stamped START, then ``after`` stamped a second after its progress."""
    import json

    records = [{"event": "start", "rank": 0, "time": START, "pid": 1, "env": {"host": "h", "node_rank": 0}},
               {"event": "step", "rank": 0, "time": progress_at, "step": 5, "step_ms": 1.0}]  # fmt: skip
    JobDir(job_dir).records_file(0).write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = lambda text, t: "".join(f"{stamp(t)}{line}\n" for line in text.splitlines())  # noqa: E731
    JobDir(job_dir).rank_log(0).write_text(lines(before, START) + lines(after, progress_at + 1))


TRACEBACK = 'Traceback (most recent call last):\n  File "/home/me/train.py", line 3, in <module>\nValueError: {}\n'


@pytest.mark.parametrize("filler_lines", [0, 10, 5000])  # the tail read first is 16 KB: 5,000 lines grow it
def test_the_error_is_the_first_traceback_after_the_last_progress_record(tmp_path, filler_lines):
    """A traceback the rank lived past (it recorded progress after it) is not what ended it."""
    filler = "".join(f"step {i} loss 1.0\n" for i in range(filler_lines))
    failing_rank(tmp_path, TRACEBACK.format("survived"), filler + TRACEBACK.format("fatal"), START + 60)
    rank = inspect(tmp_path, running=False).ranks[0]
    assert (rank.state, rank.error) == ("failed", "ValueError: fatal")


def test_a_log_without_stamps_is_searched_whole(tmp_path):
    failing_rank(tmp_path, "", "", START + 60)
    JobDir(tmp_path).rank_log(0).write_text(TRACEBACK.format("unstamped") + "x\n" * 10000)
    rank = inspect(tmp_path, running=False).ranks[0]
    assert (rank.state, rank.error) == ("failed", "ValueError: unstamped")


def test_follow_reads_an_attempts_last_lines_before_the_next_attempts_log(tmp_path):
    """Between two rounds rank 1 printed its traceback and the kit restarted it (its attempt 1
    log appeared): the traceback is shown, then the new attempt's lines; the job's end shows
    a last line cut short (no newline)."""
    from cluster.logs.follow import follow

    log0, log1 = tmp_path / "rank_00001.log", tmp_path / "rank_00001.attempt1.log"
    log0.write_text("step 10\n")
    rounds = iter([
        lambda: None,
        lambda: (log0.write_text("step 10\nTraceback (most recent call last):\nRuntimeError: boom\n"),  # appended
                 log1.write_text("resumed at step 10\nstep 2")),
        lambda: None,
    ])  # fmt: skip
    seen = []

    def stop() -> bool:
        step = next(rounds, None)
        if step is None:
            return True
        step()
        return False

    follow(JobDir(tmp_path), [1], stop, poll_s=0, out=seen.append)
    assert seen == ["[1] step 10", "[1] Traceback (most recent call last):", "[1] RuntimeError: boom",
                    "[1] resumed at step 10", "[1] step 2"]  # fmt: skip


@pytest.mark.parametrize(
    "args, names",
    [
        (["logs", "{job}", "--goodput", "--mtbf-hours", "-3"], ["--mtbf-hours", "must be > 0"]),
        (["logs", "{job}", "--rank", "0", "--tail", "0"], ["--tail", "must be >= 1"]),
        (["cancel", "{job}", "--grace", "-1"], ["--grace"]),
        (["stacks", "{job}", "--timeout", "0"], ["--timeout"]),
        (["logs", "{empty}"], ["not a job directory of the kit"]),
        (["status", "{empty}"], ["not a job directory of the kit"]),
        (["goodput", "--simulate", "nodes=0"], ["nodes", "must be >= 1"]),
        (["goodput", "--simulate", "mtbf_h=-1"], ["mtbf_h", "must be > 0"]),
        (["goodput", "--simulate", "node_loss=2"], ["node_loss"]),
    ],
)
def test_bad_numbers_and_directories_exit_2_naming_them(args, names, tmp_path):
    """Where a negative MTBF was a traceback (math domain error) and a directory that is no
    job's an empty report with exit 0."""
    job = tmp_path / "job" / "12"
    make_job(job, world=2, lines=5)
    (tmp_path / "empty").mkdir()
    done = run_module("cluster", *(a.format(job=job, empty=tmp_path / "empty") for a in args))
    assert done.returncode == 2 and all(n in done.stderr for n in names), done.stderr
    assert "Traceback" not in done.stderr


def test_the_rules_judge_made_up_evidence_without_a_file():
    """cluster.logs.rules is pure: a rank's evidence in, its state out; the hang's stacks come
    through a function, here a dict."""
    from cluster.logs.kills import SchedulerKills
    from cluster.logs.reader import RankEvidence
    from cluster.logs.rules import Judging, find_hang, rank_state, triage
    from cluster.logs.stacks import Frame, Stack

    def judged(**fields):
        scan = {"last_time": 100.0, "stalled": None, "signal": None, "mtime": 130.0, **fields.pop("scan", {})}
        evidence = RankEvidence(rank=fields.pop("rank", 0), logs=["r.log"], scan=scan, **fields)
        return rank_state(evidence, Judging(False, None, 200.0, 300.0, True, SchedulerKills(), lambda: ("no log", "")))

    stalled = judged(trained=True, progress=90.0, last_step=10, scan={"stalled": "Timeout (0:00:25)!"})
    assert (stalled.state, stalled.error_time, stalled.last_step) == ("stalled", 90.0, 10)
    killed = judged(rank=1, progress=91.0, trained=True)
    assert killed.state == "killed" and "killed by a signal?" in killed.error and killed.error_time == 130.0
    done = judged(final=True, end={"exit_code": 0, "steps": 0})
    assert done.state == "no_progress"
    # exit 0 from its own SIGTERM handler (Lightning's Trainer at the time limit): stopped, not completed
    stopped = judged(trained=True, progress=95.0, end={"exit_code": 0, "steps": 50, "terminated": True})
    assert (
        stopped.state == "killed"
        and stopped.error == "SIGTERM came; its own SIGTERM handler stopped it unfinished (exit 0)"
    )
    sleeping = Stack([Frame("/u/train.py", 35, "main")], "dump")
    waiting = Stack(
        [Frame("/x/torch/distributed/distributed_c10d.py", 1, "all_reduce"), Frame("/u/train.py", 30, "main")], "stall"
    )
    stacks_of = {0: sleeping, 1: waiting}
    culprit, peer = (
        judged(rank=0, trained=True, progress=90.0),
        judged(rank=1, trained=True, progress=90.5, scan={"stalled": "Timeout (0:00:25)!"}),
    )
    hang = find_hang([culprit, peer], lambda r: stacks_of[r.rank])
    first, cascade = triage([culprit, peer], hang, lambda r: stacks_of[r.rank])
    assert hang["culprits"] == [0] and first["rank"] == 0 and first["state"] == "stalled" and first["time"] == 90.0
    assert "train.py:35 in main" in first["error"] and cascade == {"stall watchdog fired": [1]}


# Issue 76: rank 1 on n2 SIGKILLed; its log went on after its death (its leftovers' lines, the
# stamper's note of them, stamped 0.61 s on), past srun's SIGTERM to rank 0 on n1 at 0.59 s.
SIGKILLED_RANK_1 = "srun: error: n2: task 1: Killed\nsrun: error: n1: task 0: Terminated\n"
SIGKILLED_RANK_1_TORCHRUN = "srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Terminated\n"
AGENT_OF_N2 = AGENT_REPORT.replace("rank      : 3", "rank      : 1")


@pytest.mark.parametrize(
    "batch_log, plan, agent_log, peer",
    [
        (SIGKILLED_RANK_1, {}, None, {}),  # per_task: srun's account of each rank
        (SIGKILLED_RANK_1, {}, None, {"error": "RuntimeError: Connection closed by peer", "error_time": 100.55}),
        (SIGKILLED_RANK_1_TORCHRUN, TORCHRUN, AGENT_OF_N2, {}),  # an agent a node: its account of rank 1
        ("cluster.controller: task 1: Killed\ncluster.controller: task 0: Terminated\n", {}, None, {}),  # local
    ],
)  # fmt: skip
def test_a_rank_ended_by_a_signal_sent_to_the_whole_job_is_never_the_culprit(batch_log, plan, agent_log, peer,
                                                                           tmp_path):  # fmt: skip
    """Whatever the stamps say: the peer that srun ended (SIGTERM) or that failed on the dead
    rank's absence is in the cascade; rank 1, killed otherwise, is the first failure, and the
    record says why."""
    from cluster.logs.kills import scheduler_kill
    from cluster.logs.reader import RankEvidence
    from cluster.logs.rules import Judging, rank_state, triage

    job_dir = tmp_path / "job" / "12"
    job_dir.mkdir(parents=True)
    (tmp_path / "job" / "slurm-12.log").write_text(batch_log)
    if agent_log:
        (job_dir / "node_00000.log").write_text("")
        (job_dir / "node_00001.log").write_text(agent_log)
    kills = scheduler_kill(JobDir(job_dir), plan, JobDir(job_dir).names())
    judging = Judging(False, None, 200.0, 300.0, True, kills, lambda: ("no log", ""))
    nodes = {0: "n1", 1: "n2"}

    def judged(rank, last_time, mtime, **scan):
        scan = {"last_time": last_time, "stalled": None, "signal": None, "mtime": mtime, **scan}
        return rank_state(RankEvidence(rank=rank, node=rank, node_name=nodes[rank], logs=["r.log"], scan=scan,
                                       trained=True, progress=last_time, last_step=120), judging)  # fmt: skip

    dead = judged(1, 100.3, 100.61)  # its last line 100.3; its log written on after its death
    alive = judged(0, 100.587, 100.59, **peer)
    first, cascade = triage([alive, dead])
    assert first["rank"] == 1 and first["node"] == 1, first
    assert "SIGKILL" in first["error"] and "SIGKILL" in first["evidence"]
    assert sum(cascade.values(), []) == [0]
    if not peer:
        assert alive.job_wide and "1 rank(s) ended by a signal sent to the whole job" in first["evidence"]


def test_a_childs_traceback_and_the_stampers_note_are_not_the_ranks_end(tmp_path):
    """A rank SIGKILLed while DCP's writing process ran: the writer's EOFError traceback
    (multiprocessing's "Process SpawnProcess-1:") and the stamper's note of the SIGTERM it sent
    what the rank left came after the rank's death, into its log: neither is the rank's error or
    signal, and srun's "Killed" names its end (issue 76)."""
    from cluster.logs.scan import scan_log
    from train.contract.protocol import LEFTOVERS

    log = tmp_path / "rank_00001.log"
    log.write_text(
        "2026-12-06T23:00:51.100 step 120\n"
        "2026-12-06T23:00:51.346 Process SpawnProcess-1:\n"
        f"2026-12-06T23:00:51.375 kit: {LEFTOVERS} (pid 29297, 29298): SIGTERM to them\n"
        "2026-12-06T23:00:51.375 Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap\n'
        "2026-12-06T23:00:51.375     self.run()\n"
        '  File "/usr/lib/python3.11/multiprocessing/connection.py", line 399, in _recv\n'
        "2026-12-06T23:00:51.375     raise EOFError\n"
        "2026-12-06T23:00:51.375 EOFError\n"
    )
    scan = scan_log(log)
    assert scan["error"] is None and scan["signal"] is None
    own = tmp_path / "rank_00000.log"  # the rank's own traceback is its error still
    own.write_text(log.read_text().replace("multiprocessing/process.py", "train.py"))
    assert scan_log(own)["error"] == "EOFError"


@pytest.mark.parametrize(
    "batch_log",
    [
        "srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Killed\n",
        # the local launcher's account, in srun's words (cluster.launcher.controller)
        "cluster.controller: task 1: Exited with exit code 1\ncluster.controller: task 0: Killed\n",
    ],
)
def test_a_peer_that_outlived_its_sigterm_is_the_cascade_of_the_rank_that_raised(batch_log, tmp_path):
    """Rank 1 raised (srun: exit code 1, named first); srun ended the step, and rank 0, stuck in
    a collective since its last line (before rank 1's traceback), outlived its SIGTERM and was
    SIGKILLed KillWait later: srun's "Killed" for it comes after rank 1's end, so it is the
    step's end, not a cause, and rank 1's ValueError is the first failure."""
    from cluster.logs.kills import scheduler_kill
    from cluster.logs.reader import RankEvidence
    from cluster.logs.rules import Judging, rank_state, triage

    job_dir = tmp_path / "job" / "12"
    job_dir.mkdir(parents=True)
    (tmp_path / "job" / "slurm-12.log").write_text(batch_log)
    judging = Judging(False, None, 200.0, 300.0, True, scheduler_kill(JobDir(job_dir), {}, JobDir(job_dir).names()),
                      lambda: ("no log", ""))  # fmt: skip
    peer = rank_state(RankEvidence(rank=0, node=0, node_name="n1", logs=["r.log"], trained=True, progress=100.0,
                                   scan={"last_time": 100.0, "mtime": 136.0}), judging)  # fmt: skip
    raised = rank_state(RankEvidence(rank=1, node=1, node_name="n2", logs=["r.log"], trained=True, progress=100.2,
                                     scan={"last_time": 100.5, "error": "ValueError: bad batch", "error_time": 100.5,
                                           "frames": ['File "train.py", line 9, in step']}), judging)  # fmt: skip
    assert peer.job_wide and "after task 1's end" in peer.error
    first, cascade = triage([peer, raised])
    assert (first["rank"], first["error"]) == (1, "ValueError: bad batch") and sum(cascade.values(), []) == [0]


def test_a_failure_reads_as_the_user_wrote_it_root_cause_first_and_the_hung_ranks_last_line(tmp_path):
    """Issue 71: frames carry the project's own paths (the snapshot's only in --json), the kit's
    entry-point frames are left out unless --verbose, --wait's end starts with the root cause
    and says rank 0's error above was its consequence, and a hang shows the culprit's last line."""
    from cluster.logs.report import RankReport, Report
    from cluster.logs.scan import last_own_line
    from cluster.logs.text import root_cause

    tree = "/p/runs/.snapshots/trees/9deca6fb"
    from cluster.logs.stacks import ROOT

    frames = [
        f'File "{ROOT}train/rank/shim.py", line 55, in main\n    runpy.run_path(script)',
        'File "<frozen runpy>", line 88, in _run_code',
        f'File "{tree}/my_train.py", line 34, in <module>\n    step()',
    ]
    first = {"rank": 2, "node": 1, "host": "n2", "gpu": 0, "time": START, "step": 150, "last_step": 140,
             "error": f"ValueError: bad batch ({tree}/data.py)", "frames": frames, "log": "rank_00002.log"}  # fmt: skip
    ranks = [RankReport(rank=r, state="failed") for r in range(3)]
    report = Report(str(tmp_path), 3, ranks, first, {"Connection closed by peer": [0, 1]}, [], False, code_tree=tree)
    text = format_report(report)
    assert 'File "my_train.py", line 34' in text and "ValueError: bad batch (data.py)" in text
    assert tree not in text and "shim.py" not in text and "(2 frame(s) of the kit left out" in text
    assert "shim.py" in format_report(report, verbose=True) and report.to_json()["code_tree"] == tree
    assert (
        root_cause(report)
        == "ROOT CAUSE: rank 2: ValueError: bad batch (data.py) (rank 0's error above is a consequence of it)"
    )
    log = tmp_path / "rank_00002.log"
    log.write_text(f"{stamp(START)}step 80 loss 2.1\n{stamp(START + 1)}shim: USR1 came\nTimeout (0:00:10)!\n"
                   '  File "x.py", line 3 in f\n')  # fmt: skip
    assert last_own_line(str(log)).endswith(") step 80 loss 2.1")
