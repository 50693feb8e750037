"""The goodput ledger on made-up records, its advice, and the simulator (real jobs' ledgers are
checked in test_local_jobs and test_slurm)."""

import json
import os
import random
import time

import pytest

from cluster.goodput.ledger import (
    AttemptTimes,
    attempt_of,
    build,
    expected_ettr,
    format_line,
    group_ledgers,
    ledger_of,
    mtbf_hours,
    young_daly_s,
)
from cluster.goodput.simulate import Scenario, parse_scenario, run_once, simulate
from cluster.jobdir import JobDir
from tests.conftest import run_module
from train.contract.errors import ConfigError
from train.contract.protocol import STAMP_FORMAT


def test_an_uninterrupted_job_is_queue_start_up_training_and_its_parts_add_up():
    a = AttemptTimes(launched=110, ended=300, first_step=130, last_progress=300, last_step=1000, step_s=0.15,
                checkpoint_s=12.0)  # fmt: skip
    ledger = build(100, [a], end=302)
    c = ledger.categories
    assert (c["queued"], c["start-up"], c["productive"], c["checkpoint"]) == (10, 20, 150, 12)
    assert c["other"] == pytest.approx(8) and c["teardown"] == 2 and c["lost work"] == 0
    assert ledger.wall_s == 202 and sum(c.values()) == pytest.approx(ledger.wall_s, rel=0.01)
    assert ledger.ettr == pytest.approx(150 / 192)
    assert format_line(ledger).startswith("goodput 78.1 % of 3m22s: 20 s start-up, 12 s checkpoint")


def test_gpu_hours_and_their_price_per_category():
    a = AttemptTimes(launched=0, ended=3600, first_step=360, last_progress=3600, last_step=3240, step_s=1.0)
    ledger = build(0, [a])
    ledger.gpus, ledger.gpu_hour = 16, 2.5
    out = ledger.to_json()
    assert out["gpu_hours"]["start-up"] == 1.6 and out["gpu_hours"]["productive"] == 14.4
    assert out["cost"]["productive"] == 36.0 and sum(out["cost"].values()) == 40.0
    assert ledger.segments == [(0, 360, "start-up", 0), (360, 3600, "productive", 0)]


def test_a_restart_shows_lost_work_detection_and_the_restart_each_as_its_own():
    """Attempt 0 reached step 120 and its last checkpoint was 100; attempt 1 resumed from 100."""
    first = AttemptTimes(launched=0, ended=80, first_step=10, last_progress=70, last_step=120, step_s=0.5,
                    failed=True)  # fmt: skip
    second = AttemptTimes(launched=90, ended=400, first_step=100, last_progress=400, start_step=100, last_step=700,
                     step_s=0.5)  # fmt: skip
    ledger = build(0, [first, second])
    c = ledger.categories
    assert c["lost work"] == 20 * 0.5 and c["detection"] == 10 and c["restart"] == 10
    assert c["productive"] == (100 + 600) * 0.5 and c["start-up"] == 20
    assert sum(c.values()) == pytest.approx(ledger.wall_s) == 400
    rows = ledger.attempts
    assert rows[0]["steps_done"] == 120 and rows[0]["steps_kept"] == 100 and rows[1]["restart"] == 10


def test_step_times_that_overstate_the_span_are_scaled_to_it_keeping_lost_work_to_productive():
    """The records' step time (a median at log steps) can exceed the span's mean on a loaded
    machine: 120 steps at 0.021 s and a 0.414-s save need 2.934 s, the span is 2.348 s (a SLURM
    run's figures). Every part is scaled by the same 0.8, so the lost work stays 20/100 of the
    productive time and the parts still add up to the span."""
    first = AttemptTimes(launched=0, ended=5, first_step=1, last_progress=3.348, last_step=120, step_s=0.021,
                    checkpoint_s=0.414, failed=True)  # fmt: skip
    second = AttemptTimes(launched=6, ended=9, first_step=7, last_progress=9, start_step=100, last_step=200,
                     step_s=0.021)  # fmt: skip
    row = build(0, [first, second]).attempts[0]
    scale = 2.348 / 2.934
    assert row["lost work"] == pytest.approx(20 * 0.021 * scale, abs=1e-3) and row["other"] == 0
    assert row["lost work"] / row["productive"] == pytest.approx(20 / 100, rel=0.01)
    assert row["productive"] + row["lost work"] + row["checkpoint"] == pytest.approx(2.348, abs=2e-3)


def test_a_hang_is_stalled_time_and_boundaries_out_of_order_are_never_negative():
    hung = AttemptTimes(launched=0, ended=200, first_step=5, last_progress=20, last_step=30, step_s=0.5, failed=True,
                   hang=True)  # fmt: skip
    late = AttemptTimes(
        launched=150, ended=300, first_step=140, last_progress=290, start_step=0, last_step=280, step_s=0.5
    )  # fmt: skip  (its first step "before" its launch: clocks of two nodes)
    ledger = build(0, [hung, late], end=310)
    assert ledger.categories["stalled"] == 180
    assert all(v >= 0 for v in ledger.categories.values())
    assert sum(ledger.categories.values()) == pytest.approx(ledger.wall_s) == 310


def test_your_own_programs_checkpoint_time_is_unknown_unless_it_says():
    records = [{"event": "start", "time": 1.0}, {"event": "first_step", "step": 1, "time": 3.0},
               {"event": "step", "step": 50, "step_ms": 10.0, "time": 4.0}, {"event": "end", "time": 5.0}]  # fmt: skip
    silent = attempt_of(records, 0.0, None, built_in=False)
    told = attempt_of([*records, {"event": "checkpoint", "step": 50, "seconds": 0.3, "time": 4.5}], 0.0, None, False)
    assert silent.checkpoint_s is None and told.checkpoint_s == 0.3
    assert not build(0, [silent]).checkpoint_known and build(0, [told]).checkpoint_known


def test_your_own_programs_lost_work_needs_its_resume_record_and_is_never_all_of_it_without():
    """The shim counts each attempt's optimizer steps from zero: attempt 0 did 120, attempt 1
    another 80 after the program loaded its checkpoint of step 100. Told (a resume record), the
    20 redone steps are lost work; not told, none is (docs/goodput.md), where a start-from-zero
    reading would call all 120 lost."""

    def attempt(launched, steps, resume=None):
        records = [{"event": "start", "time": launched}, {"event": "first_step", "step": 1, "time": launched + 5},
                   {"event": "step", "step": steps, "step_ms": 500.0, "time": launched + 5 + steps * 0.5}]  # fmt: skip
        if resume is not None:
            records.insert(1, {"event": "resume", "step": resume, "time": launched + 4})
        return attempt_of(records, launched, None, built_in=False)

    first = attempt(0, 120)
    first.failed = True
    told = build(0, [first, attempt(70, 80, resume=100)])
    assert told.categories["lost work"] == 20 * 0.5 and told.categories["productive"] == (100 + 80) * 0.5
    assert [(r["steps_done"], r["steps_kept"]) for r in told.attempts] == [(120, 100), (80, 80)]
    first = attempt(0, 120)
    first.failed = True
    silent = build(0, [first, attempt(70, 80)])
    assert silent.categories["lost work"] == 0 and silent.categories["productive"] == (120 + 80) * 0.5


def test_young_daly_and_the_mtbf_scaled_from_the_size():
    assert mtbf_hours(16384) == 1.8 and mtbf_hours(2048 * 8) == 1.8 and mtbf_hours(8) == 1.8 * 2048
    best = young_daly_s(30, 3600)
    assert best == pytest.approx(464.8, abs=0.1)
    at_best = expected_ettr(best, 30, 3600, 300)
    assert at_best > expected_ettr(best / 4, 30, 3600, 300) and at_best > expected_ettr(best * 4, 30, 3600, 300)


def test_the_simulator_ranks_the_policies_and_a_replay_is_the_ledger_arithmetic():
    at_scale = simulate(Scenario(trials=100))
    p = at_scale["policies"]
    assert p["requeue"]["ckpt_every"] < p["restart"]["ckpt_every"] < p["spare"]["ckpt_every"] < 1
    assert at_scale["recommended_ckpt_every"] == round(young_daly_s(30, 1.8 * 3600))
    # One failure at 100 s of running time, nothing random left: the ETTR by hand.
    s = Scenario(work_h=200 / 3600, step_s=1, ckpt_every=50, ckpt_s=2, startup_s=10, detection_s=5, restart_s=3,
                 node_loss=1, spare_nodes=1, failures_at=[100.0])  # fmt: skip
    # 10 s start-up, 90 s: one interval of 50 + its save, 38 s lost; 5 + 3 s; 10 s start-up; 150 s + 2 saves
    assert run_once(s, "spare", 50, random.Random(0)) == pytest.approx(200 / (100 + 5 + 3 + 10 + 150 + 4))
    # Evaluation and logging at a tenth of the steps' time: 100 s is one cycle of 55 + 2 and
    # 43 s lost; then 150 steps take 165 s, with 2 saves.
    s.other_frac = 0.1
    assert run_once(s, "spare", 50, random.Random(0)) == pytest.approx(200 / (100 + 5 + 3 + 10 + 165 + 4))


def test_simulate_keys_are_checked_by_name():
    assert parse_scenario(["nodes=16", "failures_at=10,20"]).failures_at == [10.0, 20.0]
    with pytest.raises(ConfigError, match="nodez"):
        parse_scenario(["nodez=3"])
    with pytest.raises(ConfigError, match="ckpt_s"):
        parse_scenario(["ckpt_s=-1"])


def test_cluster_goodput_simulate_prints_each_policy_and_the_advised_interval():
    """At 2048 x 8 GPUs and Meta's MTBF, asynchronous saves and warm restarts reach the 95 %
    goal at their recommended interval; every cost says where it comes from."""
    done = run_module("cluster", "goodput", "--simulate", "nodes=2048", "gpus_per_node=8", "trials=200", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out["policies"]) == {"requeue", "restart", "spare", "async", "warm"} and out["mtbf_h"] == 1.8
    assert all(0 < row[k] < 1 for row in out["policies"].values() for k in ("ckpt_every", "recommended"))
    assert out["best"]["policy"] == "warm" and out["best"]["recommended"] >= 0.95 and "in_the_way" not in out
    assert out["policies"]["async"]["recommended_ckpt_every"] == 114  # Young-Daly for a 1 s pause at 1.8 h
    assert {"ckpt_blocking_s", "startup_s", "warm_startup_s", "mtbf_h", "node_loss"} <= set(out["sources"])
    text = run_module("cluster", "goodput", "--simulate", "nodes=64", "trials=20").stdout
    assert "its recommended" in text and "warm" in text and "best: " in text
    slow = json.loads(run_module("cluster", "goodput", "--simulate", "nodes=2048", "gpus_per_node=8", "trials=50",
                                 "warm_startup_s=900", "startup_s=900", "--json").stdout)  # fmt: skip
    assert slow["best"]["recommended"] < 0.95 and "start-up" in slow["in_the_way"]["largest"]
    assert slow["sources"]["warm_startup_s"] == "given (--simulate)"
    bad = run_module("cluster", "goodput", "--simulate", "nodez=2")
    assert bad.returncode == 2 and "nodez" in bad.stderr and "Traceback" not in bad.stderr


def requeued_job(tmp_path) -> JobDir:
    """No restarts of the kit: SLURM requeued the job at step 120 (checkpoint 100); the batch
    script wrote plan.json again at the second launch, which must not date the first."""
    job = JobDir(tmp_path)
    ranks = [{"rank": r, "node": r // 2} for r in range(4)]
    plan = {"cluster": "slurm", "nodes": 2, "tasks_per_node": 2, "gpus_per_task": 1, "ranks": ranks}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "spec.yaml").write_text("name: x\n")
    (tmp_path / "train.yaml").write_text("train: {ckpt_every: 50}\n")
    os.utime(tmp_path / "spec.yaml", (1000, 1000))  # the submission
    os.utime(tmp_path / "plan.json", (1200, 1200))  # the second launch's
    records = [
        {"event": "start", "time": 1010}, {"event": "first_step", "step": 1, "time": 1020},
        {"event": "checkpoint", "step": 100, "seconds": 1.0, "time": 1070},
        {"event": "step", "step": 120, "step_ms": 500.0, "time": 1082},
        {"event": "start", "time": 1210}, {"event": "resume", "step": 100, "time": 1215},
        {"event": "first_step", "step": 101, "time": 1230},
        {"event": "step", "step": 400, "step_ms": 500.0, "final": True, "time": 1380},
    ]  # fmt: skip
    (tmp_path / "rank_00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return job


def test_a_requeued_jobs_ledger_from_its_files(tmp_path):
    ledger = ledger_of(requeued_job(tmp_path))
    c, first = ledger.categories, ledger.attempts[0]
    assert c["queued"] == 10 and first["start-up"] == 10 and "teardown" not in first
    assert first["lost work"] == 20 * 0.5 and c["restart"] == 1210 - 1082 and ledger.gpus == 4
    assert sum(c.values()) == pytest.approx(ledger.wall_s) == 380
    assert ledger.ettr == pytest.approx((100 + 300) * 0.5 / 370)


def test_a_copy_that_lost_its_files_times_still_has_a_ledger_from_its_records(tmp_path):
    """cp without -p: every file written now, after the records. The queue time is not known
    then (0); the rest is as before, where it read "0.0 % of 0.0 s"."""
    job = requeued_job(tmp_path)
    for name in ("spec.yaml", "plan.json"):
        os.utime(tmp_path / name, (5000, 5000))
    last_line = time.strftime(STAMP_FORMAT, time.localtime(1380)) + ".000 step 400\n"
    (tmp_path / "rank_00000.log").write_text(last_line)  # written now, stamped at the end
    ledger = ledger_of(job, running=False)
    assert ledger.categories["queued"] == 0 and ledger.wall_s == 370
    assert ledger.ettr == pytest.approx((100 + 300) * 0.5 / 370)


def test_each_term_is_marked_measured_the_jobs_own_given_or_assumed_with_its_source(tmp_path):
    """Issue 71: a job that saved nothing is not said to have measured a save; its own nodes,
    spares and ckpt_every replace the defaults; every assumption names its figure and, where
    the spec sets it, the spec's key."""
    from cluster.goodput.advice import simulation
    from cluster.goodput.simulate import format_simulation

    job = requeued_job(tmp_path)
    plan = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "plan.json").write_text(json.dumps({**plan, "spare_nodes": 1}))
    scenario, result = simulation(job, ["trials=5", "mtbf_h=2"], lambda text: None)
    kinds = result["kinds"]
    assert (scenario.nodes, scenario.spare_nodes, scenario.ckpt_every, scenario.ckpt_s) == (2, 1, 50, 1.0)
    assert [k for k in ("nodes", "spare_nodes", "ckpt_every") if kinds[k] == "job"] == [
        "nodes",
        "spare_nodes",
        "ckpt_every",
    ]
    assert (kinds["ckpt_s"], kinds["step_s"], kinds["mtbf_h"], kinds["work_h"]) == (
        "measured",
        "measured",
        "given",
        "assumed",
    )
    unsaved = [r for r in map(json.loads, (tmp_path / "rank_00000.jsonl").read_text().splitlines())
               if r["event"] != "checkpoint"]  # fmt: skip
    (tmp_path / "rank_00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unsaved))
    (tmp_path / "train.yaml").write_text("train: {}\n")
    scenario, result = simulation(job, ["trials=5"], lambda text: None)
    assert result["kinds"]["ckpt_s"] == "assumed" and result["kinds"]["ckpt_every"] == "assumed"
    text = "\n".join(format_simulation(scenario, result))
    assert "measured (the job's ledger): step_s 0.5" in text and "ckpt_s" not in text.split("assumed")[0]
    assert "  ckpt_every 500: a save every 500 steps (none measured" in text
    assert "  ckpt_s 30: a synchronous save's pause" in text and "  work_h 24: a day of training" in text


def test_the_timeline_has_a_row_per_attempt_and_group_of_ranks(tmp_path):
    """The second node's ranks (2-3) got their first step 5 s later: their group's row shows a
    longer start-up than rank 0's; groups without records are left out."""
    from cluster.views.charts import plot_goodput

    job = requeued_job(tmp_path)
    late = [{**r, "time": r["time"] + 5} if r["event"] == "first_step" else r
            for r in map(json.loads, (tmp_path / "rank_00000.jsonl").read_text().splitlines())]  # fmt: skip
    (tmp_path / "rank_00002.jsonl").write_text("".join(json.dumps(r) + "\n" for r in late))
    groups = group_ledgers(job)
    assert [label for label, _ in groups] == ["ranks 0-1", "ranks 2-3"]
    assert groups[1][1].attempts[0]["start-up"] == groups[0][1].attempts[0]["start-up"] + 5
    drawn = plot_goodput(ledger_of(job), "a requeued job", tmp_path / "timeline.png", groups)
    assert {"queued", "start-up", "productive", "lost work", "restart"} <= set(drawn)
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_hang_without_restarts_is_stalled_until_the_watchdogs_dump(tmp_path):
    """No restarts, so no end record of the kit's: rank 0's records stop at its last step; its
    log's stall dump (the watchdog, 30 s later) dates the end. While the job runs, nothing is
    assumed of the time since."""
    plan = {"cluster": "slurm", "nodes": 1, "tasks_per_node": 2, "gpus_per_task": 1, "ranks": []}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "spec.yaml").write_text("name: x\n")
    os.utime(tmp_path / "spec.yaml", (1000, 1000))
    os.utime(tmp_path / "plan.json", (1005, 1005))
    records = [{"event": "start", "time": 1006}, {"event": "first_step", "step": 1, "time": 1010},
               {"event": "step", "step": 100, "step_ms": 100.0, "time": 1020}]  # fmt: skip
    (tmp_path / "rank_00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "rank_00000.log").write_text(
        "2026-01-01T00:00:00.000 step 100\nTimeout (0:00:30)!\nThread 0x1 (most recent call first):\n"
        '  File "train.py", line 9 in main\n'
    )
    os.utime(tmp_path / "rank_00000.log", (1050, 1050))
    over = ledger_of(JobDir(tmp_path), running=False)
    assert over.categories["stalled"] == 30 and over.wall_s == 50 and over.attempts[0]["stalled"] == 30
    running = ledger_of(JobDir(tmp_path), running=True)
    assert running.categories["stalled"] == 0 and running.wall_s == 20


def test_an_attempt_ended_before_rank_0_started_is_a_row_of_its_own(tmp_path):
    """A second fault while the kit recovers from the first (seen in the SLURM tier under load):
    attempt 1 is ended before rank 0 wrote its start record. The ledger still has three
    attempts, each paired with its own start and end in attempts.jsonl; attempt 1 is start-up
    until its error, then a restart; attempt 0's lost work counts to the checkpoint attempt 2
    resumed from."""
    plan = {"cluster": "slurm", "nodes": 2, "tasks_per_node": 2, "gpus_per_task": 1, "ranks": []}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "spec.yaml").write_text("name: x\n")
    os.utime(tmp_path / "spec.yaml", (1000, 1000))
    kit = [
        {"event": "start", "attempt": 0, "nodes": ["n1", "n2"], "time": 1005},
        {"event": "end", "attempt": 0, "verdict": "restart", "failed_at": 1090, "time": 1092},
        {"event": "start", "attempt": 1, "nodes": ["n1", "n3"], "time": 1095},
        {"event": "end", "attempt": 1, "verdict": "restart", "failed_at": 1101, "time": 1103},
        {"event": "start", "attempt": 2, "nodes": ["n1", "n3"], "time": 1105},
    ]  # fmt: skip
    (tmp_path / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kit))
    records = [
        {"event": "start", "env": {"restart": 0}, "time": 1006}, {"event": "first_step", "step": 1, "time": 1008},
        {"event": "checkpoint", "step": 100, "seconds": 1.0, "time": 1060},
        {"event": "step", "step": 120, "step_ms": 500.0, "time": 1070},
        {"event": "start", "env": {"restart": 2}, "time": 1106}, {"event": "resume", "step": 100, "time": 1110},
        {"event": "first_step", "step": 101, "time": 1115},
        {"event": "step", "step": 400, "step_ms": 500.0, "final": True, "time": 1265},
    ]  # fmt: skip
    (tmp_path / "rank_00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    ledger = ledger_of(JobDir(tmp_path), running=False)
    first, second, third = ledger.attempts
    assert first["lost work"] == 20 * 0.5 and first["detection"] == 1090 - 1070 and first["restart"] == 2
    # restart: 3 s to its launch, and 2 s from its error to its end (the next launch's 2 s are the next row's)
    assert second == {"attempt": 1, "restart": 3 + 2, "start-up": 1101 - 1095, "detection": 0}
    assert third["restart"] == 1105 - 1103 and third["start-up"] == 1115 - 1105
    c = ledger.categories
    assert c["productive"] == (100 + 300) * 0.5 and sum(c.values()) == pytest.approx(ledger.wall_s) == 265


# ----------------------------------------------------------------------------- the dating rules, from tables
@pytest.mark.parametrize("written, first, expected", [
    (100.0, {"time": 130.0, "launched": 120.0}, (100.0, True)),   # spec.yaml written before the ranks: it dates it
    (100.0, {"time": 130.0}, (100.0, True)),                      # no process start: the record's time
    (200.0, {"time": 130.0, "launched": 120.0}, (120.0, False)),  # a copy without its times: the first process start
])  # fmt: skip
def test_the_submission_is_spec_yamls_write_unless_a_copy_lost_the_times(written, first, expected):
    from cluster.goodput.ledger import submission_time

    assert submission_time(written, first) == expected


def times(queue=True, marker=None):
    from cluster.goodput.ledger import JobTimes

    return JobTimes(plan={}, records=[], written=100.0, queue=queue, marker_written=marker)


MINE = [{"event": "start", "time": 140.0, "launched": 135.0}]


@pytest.mark.parametrize("number, kit_start, t, expected", [
    (0, None, times(), 135.0),                  # no marker: the rank's process start
    (0, None, times(marker=110.0), 110.0),      # the batch script's marker, between submission and the records
    (0, None, times(marker=150.0), 135.0),      # a marker written again after the records: a later launch's
    (0, None, times(marker=90.0), 135.0),       # ... or before the submission: not this job's launch
    (0, 112.0, times(), 112.0),                 # the kit's start record of it (restarts)
    (0, 112.0, times(queue=False), 100.0),      # no queue: the first launches at submission
    (2, 160.0, times(queue=False), 160.0),      # a restart: the kit's start record, queue or not
    (1, None, times(marker=110.0), 135.0),      # a requeue: the marker dates the first only
])  # fmt: skip
def test_an_attempt_launches_at_the_first_of_the_rules_that_knows(number, kit_start, t, expected):
    from cluster.goodput.ledger import launch_time

    assert launch_time(number, MINE, kit_start, t, submitted=100.0) == expected


@pytest.mark.parametrize("launched, number, released, expected", [
    (110.0, 0, 150.0, 150.0),   # --after: waiting for the parents is queue
    (110.0, 0, 90.0, 110.0),    # released before its launch: the launch stands
    (110.0, 1, 150.0, 110.0),   # only the first attempt waited for them
    (110.0, 0, None, 110.0),
])  # fmt: skip
def test_the_after_release_moves_only_the_first_launch(launched, number, released, expected):
    from cluster.goodput.ledger import after_release

    assert after_release(launched, number, released) == expected


def test_an_attempt_that_never_started_resumed_where_the_next_did_and_ends_are_clamped():
    from cluster.goodput.ledger import clamp_ends, never_started_resume

    attempts = [AttemptTimes(0.0, 50.0, start_step=0, last_progress=60.0), AttemptTimes(70.0, 70.0, start_step=None),
                AttemptTimes(80.0, 99.0, start_step=40, last_progress=95.0)]  # fmt: skip
    never_started_resume([0, 1, 2], attempts, seen={0, 2})
    assert [a.start_step for a in attempts] == [0, 40, 40]
    clamp_ends([0, 1, 2], attempts, kit_started={1})
    # attempt 0: at least its last progress (60), and the kit started 1 (no clamp to its launch);
    # attempt 1: the kit did not start 2 (a requeue): no later than 2's launch
    assert [a.ended for a in attempts] == [60.0, 70.0, 99.0]


@pytest.mark.parametrize("scan, kept, expected", [
    (None, True, (50.0, False, False)),                                                    # no log
    ({"mtime": 80.0, "last_time": 70.0, "stalled": True, "error": ""}, True, (80.0, True, False)),
    ({"mtime": 80.0, "last_time": 70.0, "stalled": False, "error": "boom"}, False, (70.0, False, True)),
])  # fmt: skip
def test_the_last_attempt_ends_where_its_log_does(scan, kept, expected):
    from cluster.goodput.ledger import ended_by_log

    last = AttemptTimes(0.0, 50.0)
    assert ended_by_log(last, scan, kept) == expected[0] and (last.ended, last.hang, last.failed) == expected
