"""A run across its jobs: --until-done's decision after each job (cluster.runs.resume.stop_reason),
as a table; its series and goodput joined across its jobs; the listing of every run under a log
root (cluster.runs.listing) and its index."""

import pytest

from cluster.goodput.ledger import CATEGORIES, Ledger, joined
from cluster.logs.series import joined_series
from cluster.runs.listing import INDEX, list_runs, since_seconds, state_matches
from cluster.runs.resume import Link, resumed_words, stop_reason
from fixtures.synthetic import FIRST_JOB_ID, make_log_root
from tests.conftest import run_module
from train.contract.errors import ConfigError

GOES_ON = Link("TIMEOUT", done=False, progressed=True)
STUCK = Link("TIMEOUT", done=False, progressed=False)

CASES = [
    ([Link("COMPLETED", done=True, progressed=True)], None),
    ([GOES_ON], ""),
    ([GOES_ON, STUCK], ""),  # one job without a new checkpoint: once more
    ([GOES_ON, STUCK, STUCK], "two jobs in a row left no new checkpoint"),
    ([STUCK, GOES_ON, STUCK], "it has had 3 jobs"),  # not two in a row: only the cap stops it
    ([Link("CANCELLED", done=False, progressed=True)], "its last job was cancelled"),
    ([Link("FAILED", done=False, progressed=True, deterministic=True)], "as a restart would fail again"),
    ([Link("FAILED", done=False, progressed=False, resumable=False)], "no checkpoint to go on from"),
    ([GOES_ON] * 3, "it has had 3 jobs"),
    ([GOES_ON] * 2 + [Link("COMPLETED", done=True, progressed=True)], None),  # done at the cap: done
]


@pytest.mark.parametrize("links, why", CASES, ids=[f"{len(c[0])}-{c[1]}" for c in CASES])
def test_until_done_goes_on_while_a_job_makes_progress_and_stops_saying_why(links, why):
    said = stop_reason(links, max_jobs=3)
    assert said == why if why in (None, "") else why in said


def test_a_resumed_job_says_from_where():
    assert resumed_words({"id": "r", "job": 1}) == "job 1 of run r"
    run = {"id": "r", "job": 3, "from": "/runs/local/12", "from_step": 41000}
    assert resumed_words(run) == "job 3 of run r, resumed from step 41,000 of /runs/local/12"
    assert "the program's own checkpoints of /runs/local/12" in resumed_words({**run, "from_step": None})


# ----------------------------------------------------------------- a run as one thing to look at
SERIES_CASES = [
    # (each job's series and the step it resumed from) -> the run's
    ([({"loss": [(10, 1.0), (20, 0.9)]}, None)], {"loss": [(10, 1.0), (20, 0.9)]}),
    # job 1 went on to step 40, job 2 loaded step 20: job 1's 30 and 40 were done again
    ([({"loss": [(10, 1.0), (20, 0.9), (30, 0.8), (40, 0.7)]}, None), ({"loss": [(30, 0.81), (40, 0.71)]}, 20)],
     {"loss": [(10, 1.0), (20, 0.9), (30, 0.81), (40, 0.71)]}),
    # a metric job 2 logs later than the step it went on from: job 1's past that step is dropped too
    ([({"eval": [(10, 5.0), (30, 4.0)]}, None), ({"eval": [(50, 3.0)]}, 20)], {"eval": [(10, 5.0), (50, 3.0)]}),
    # a program that does not say where it went on: a step logged again is the later job's
    ([({"loss": [(1, 1.0), (2, 0.9), (3, 0.8)]}, None), ({"loss": [(2, 0.95), (3, 0.85)]}, None)],
     {"loss": [(1, 1.0), (2, 0.95), (3, 0.85)]}),
]  # fmt: skip


@pytest.mark.parametrize("parts, run", SERIES_CASES)
def test_a_runs_series_keeps_each_step_once_the_later_jobs(parts, run):
    assert joined_series(parts) == run


def test_a_runs_goodput_queues_the_time_between_its_jobs_and_counts_redone_steps_as_lost():
    """Two jobs of 100 s each (10 s queued, 80 s productive at 1 s a step, 10 s other), 30 s apart;
    job 1 trained 5 steps past the checkpoint job 2 went on from."""

    def job() -> Ledger:
        spent = dict.fromkeys(CATEGORIES, 0.0) | {"queued": 10.0, "productive": 80.0, "other": 10.0}
        return Ledger(100.0, spent, attempts=[{"attempt": 0, "step_s": 1.0}], gpus=8)

    run = joined([job(), job()], gaps_s=[30.0], redone=[5])
    assert run.wall_s == 230.0 and run.categories["queued"] == 50.0
    assert (run.categories["productive"], run.categories["lost work"]) == (155.0, 5.0)
    assert run.ettr == pytest.approx(155.0 / 180.0) and run.gpus == 8


def test_the_listing_reads_each_ended_job_once_and_again_only_when_its_directory_changes(tmp_path):
    """Four ended local jobs, two runs of two: the listing groups them, newest run first, with
    each run's steps, loss and state; the second listing reads the index alone (the jobs' files
    made unreadable are not read), a job whose directory changed is read again."""
    root = make_log_root(tmp_path / "runs", 4, failed_every=4)
    runs = list_runs(root)
    assert [(r.id, [j.number for j in r.jobs]) for r in runs] == [("synthetic-000001", [1, 2]),
                                                                 ("synthetic-000000", [1, 2])]  # fmt: skip
    newest, oldest = (r.summary(now=0) for r in runs)
    assert (oldest["state"], oldest["step"], oldest["steps"], oldest["loss"]) == ("COMPLETED", 100, 100, 1.0)
    assert newest["state"] == "FAILED" and "rank 1 failed: RuntimeError: synthetic failure" in newest["culprit"]
    assert runs[0].jobs[1].from_step == 50 and (root / INDEX).is_file()
    for records in root.glob("synthetic/*/rank_*.jsonl"):
        records.write_text("")  # emptied in place: the directories' times stay
    assert [r.summary(now=0) for r in list_runs(root)] == [newest, oldest]  # from the index alone
    changed = root / "synthetic" / str(FIRST_JOB_ID)
    (changed / "page.html").write_text("")  # a file added: the directory's time moves
    (older,) = [r for r in list_runs(root) if r.id == "synthetic-000000"]
    assert older.jobs[0].step is None and older.jobs[1].step == 100  # it alone read again: its records are empty


def test_the_filters_and_their_bad_input():
    assert since_seconds("2d") == 172800 and since_seconds("90m") == 5400 and since_seconds("1.5h") == 5400
    assert (
        state_matches("FAILED", "failed") and state_matches("RUNNING", "live") and state_matches("PENDING", "waiting")
    )
    assert not state_matches("COMPLETED", "failed")
    for bad in ("2 days", "-1d", "d"):
        with pytest.raises(ConfigError, match="--since"):
            since_seconds(bad)


def test_cluster_runs_refuses_a_bad_state_or_root_with_exit_2(tmp_path):
    make_log_root(tmp_path, 2)
    for args, words in ((["--state", "finished"], "--state: 'finished' is no state"),
                        (["--since", "yesterday"], "--since: 'yesterday' is no age"),
                        (["--log-dir", str(tmp_path / "nowhere")], "no such log root")):  # fmt: skip
        done = run_module("cluster", "runs", "--log-dir", str(tmp_path), *args)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
