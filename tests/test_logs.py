"""The log inspector on synthetic job directories (real failures are in test_local_jobs/test_slurm)."""

from cluster.logs import compress, inspect, parse_traceback
from cluster.synthetic import START, make_job


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


def test_compress():
    assert compress([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_triage_of_many_ranks(tmp_path):
    """The benchmark's synthetic job, scaled down (its speed against grep is the benchmark's:
    docs/benchmarks.md, 1024 ranks x 5,000 lines); 128 ranks take the multi-process path."""
    job = make_job(tmp_path, world=128, lines=2000, crash_rank=77)
    report = inspect(job, running=False)
    assert report.first_failure["rank"] == 77
    assert sorted(r for ranks in report.cascade.values() for r in ranks) == [r for r in range(128) if r != 77]
