import pytest

from tests.conftest import run_module


@pytest.mark.slow
def test_quick_report_writes_markdown_and_plots(tmp_path):
    """`make bench` end to end, in its --quick form (1 round, short runs), into a temporary folder."""
    out = tmp_path / "benchmarks.md"
    result = run_module("bench.report", "--quick", f"--out={out}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    for needle in (
        "single / minimal",
        "| fsdp@tp2 | 4 |",
        "busbw",
        "Log triage",
        "Every run under a log root of 200",
        "The job page of 64 ranks",
        "## Checkpoints: what a save stops the loop for",
        "1024 nodes x 8 GPUs",
        "| param_avg@k4 | 2 |",
        "## Restarts",
        "**1 tree** in the store",  # a sweep's points share the code snapshot
        "| snapshot, new store |",
    ):
        assert needle in text, needle
    from bench.goals import GOALS

    # the goals are data, said beside their figures; no heading names an issue
    for goal in ("loop_ratio", "plan_ms", "triage_s", "triage_ratio", "runs_listing_s", "page_open_s"):
        assert GOALS[goal].said() in text, goal
    assert not [line for line in text.splitlines() if line.startswith("#") and "issue" in line]
    for png in ("throughput.png", "state_bytes.png", "busbw.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_the_benchmark_plots_draw_every_strategy_and_point(tmp_path):
    """What each plot draws, from the rows it is given (not only that a PNG was written)."""
    from bench.markdown import plots

    mib = 2**20
    rows = [{"strategy": "single", "nprocs": 1, "samples_per_s": 900.0, "state_bytes": None},
            {"strategy": "fsdp", "nprocs": 4, "samples_per_s": 300.0,
             "state_bytes": {"params": mib, "grads": mib, "optimizer": 2 * mib}}]  # fmt: skip
    sweep = [{"bytes": 1024, "busbw_gbps": 0.5}, {"bytes": 2048, "busbw_gbps": 0.9}]
    drawn = plots(rows, sweep, tmp_path)
    assert drawn == {
        "throughput.png": [("single\nx1", 900.0), ("fsdp\nx4", 300.0)],
        "state_bytes.png": [("fsdp\nx4", 1.0, 1.0, 2.0)],  # single holds no state_bytes: no bar
        "busbw.png": [(1024, 0.5), (2048, 0.9)],
    }
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in drawn)


@pytest.mark.parametrize("goal, figure, met", [
    ("plan_ms", 499.0, True), ("plan_ms", 500.0, False), ("loop_ratio", 0.97, True), ("loop_ratio", 0.9, False),
    ("simulator_points", -2.5, True), ("simulator_points", 3.5, False),
])  # fmt: skip
def test_a_goal_is_data_that_says_itself_and_tells_whether_a_figure_meets_it(goal, figure, met):
    from bench.goals import GOALS

    assert GOALS[goal].met(figure) is met
    assert GOALS["runs_listing_s"].said() == "goal <= 1 s at 10,000"
