"""--until-done's decision after each job of a run (cluster.runs.stop_reason), as a table."""

import pytest

from cluster.runs import Link, resumed_words, stop_reason

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
