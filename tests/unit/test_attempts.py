"""Restarts inside the allocation: the decision after a failed attempt (pure, table-tested)
and the attempt record that `cluster logs` and `cluster status` show."""

import json

import pytest

from cluster.backends.slurm.attempts import BAD_NODE_STATES, DEAD_NODE_STATES, batch_node_lost, nodes_in
from cluster.jobdir import JobDir
from cluster.restarts.attempts import the_failure
from cluster.restarts.history import format_attempts, summary
from cluster.restarts.policy import Decision, decide, restart_needs
from train.contract.protocol import never_joined_message, preflight_log_name, record_name

ALLOC = ["n1", "n2", "n3"]
CRASH = {"rank": 3, "node": "n2", "error": "RuntimeError: boom", "step": 120, "raised": True, "raised_at": 120}
KILLED = {"rank": 2, "node": "n2", "error": "ended without an error message (killed by a signal?)", "step": 150,
          "raised": False, "raised_at": None}  # fmt: skip
NAN = "NonFiniteLoss: the state at step {} is non-finite"


def ended(error="RuntimeError: boom", step=120, excluded=(), raised=True):
    return {"error": error, "step": step, "excluded": [list(pair) for pair in excluded], "verdict": "restart",
            "raised": raised, "raised_at": step if raised else None}  # fmt: skip


@pytest.mark.parametrize(
    "history, failure, exit_code, nodes, down, want",
    [
        # the culprit's node is replaced by the spare, in the allocation's order
        ([], CRASH, 1, ["n1", "n2"], set(), ("restart", ("n1", "n3"), ("n2",))),
        # no spare left: the same nodes again (a crash need not be the node's fault)
        ([ended("x", 5, [("n2", "")])], CRASH | {"node": "n3"}, 1, ["n1", "n3"], set(), ("restart", ("n1", "n3"), ())),
        # a node SLURM reports down goes, whoever the culprit
        ([], CRASH | {"node": None, "rank": None}, 1, ["n1", "n2"], {"n2"}, ("restart", ("n1", "n3"), ("n2",))),
        # down and nothing to replace it with
        ([], CRASH, 1, ["n1", "n2"], {"n2", "n3"}, ("no_nodes", (), ())),
        # the same error at the same step after a restart: a bug, not a node
        ([ended()], CRASH | {"node": "n3"}, 1, ["n1", "n3"], set(), ("deterministic", (), ())),
        # a killed rank, twice at the same step (the same generic text): a lost node, not a bug
        ([ended(KILLED["error"], 150, [("n2", "")], raised=False)], KILLED | {"node": "n3"}, 1, ["n1", "n3"], set(), ("restart", ("n1", "n3"), ())),
        # an exception now, but the earlier attempt's ranks were killed: restart again
        ([ended(excluded=[("n2", "")], raised=False)], CRASH | {"node": "n3"}, 1, ["n1", "n3"], set(), ("restart", ("n1", "n3"), ())),
        # an exception before this attempt's first step (not raised in training): restart again
        ([ended(excluded=[("n2", "")])], CRASH | {"node": "n3", "raised": False}, 1, ["n1", "n3"], set(), ("restart", ("n1", "n3"), ())),
        # non-finite again after resuming from the last finite checkpoint, at another step
        ([ended(NAN.format(5), 5)], CRASH | {"node": "n3", "error": NAN.format(9), "raised_at": 9}, 1, ["n1", "n3"], set(),
         ("deterministic", (), ())),
        # the same error at another step: restart again
        ([ended(step=60, excluded=[("n2", "")])], CRASH | {"node": "n3"}, 1, ["n1", "n3"], set(), ("restart", ("n1", "n3"), ())),
        # bad configuration (exit 2) and an import error: never restarted
        ([], CRASH, 2, ["n1", "n2"], set(), ("deterministic", (), ())),
        ([], CRASH | {"error": "ModuleNotFoundError: No module named 'x'"}, 1, ["n1", "n2"], set(), ("deterministic", (), ())),
        # every restart used
        ([ended("a", 1), ended("b", 2)], CRASH, 1, ["n1", "n2"], set(), ("exhausted", (), ())),
        # ranks that never joined the preflight: their node is the suspect
        ([], CRASH | {"suspects": ["n2"]}, 1, ["n1", "n2"], set(), ("restart", ("n1", "n3"), ("n2",))),
        # a requeue (the batch node lost) is SLURM's, not one of the restarts
        ([ended("a", 1), ended("b", 2) | {"verdict": "requeued"}], CRASH, 1, ["n1", "n2"], set(), ("restart", ("n1", "n3"), ("n2",))),
    ],
)  # fmt: skip
def test_what_follows_a_failed_attempt(history, failure, exit_code, nodes, down, want):
    decision = decide(history, failure, exit_code, ALLOC, nodes, restarts=2, down=down)
    assert isinstance(decision, Decision)
    assert (decision.verdict, decision.nodes, tuple(n for n, _ in decision.excluded)) == want, decision.why


@pytest.mark.parametrize(
    "left, needs, want",
    [
        (3000.0, 200.0, "restart"),
        (None, 200.0, "restart"),  # no time limit
        # The time-limit signal came while no attempt ran, or would before the next could save
        (150.0, 200.0, "time_near"),
    ],
)
def test_no_restart_when_the_time_limit_is_nearer_than_what_a_restart_needs(left, needs, want):
    decision = decide([], CRASH, 1, ALLOC, ["n1", "n2"], restarts=2, time_left_s=left, restart_needs_s=needs)
    assert decision.verdict == want, decision.why
    if want == "time_near":
        assert decision.why.startswith("150 s left before the time limit, less than a restart needs (200 s")


def test_what_a_restart_needs_is_the_signals_lead_a_start_up_and_slurms_minute():
    attempt = {"attempt": 1, "time": 1000.0}
    records = [{"event": "first_step", "time": 900.0}, {"event": "first_step", "time": 1025.0}]  # attempt 0's, then 1's
    assert restart_needs({"signal": "USR1@120"}, attempt, records, 60) == 120 + 25 + 60
    assert restart_needs({"signal": ""}, attempt, [], 60) == 60  # no signal, no first step yet


@pytest.mark.parametrize(
    "history, failure, nodes, down, min_nodes, want",
    [
        # 3 nodes, no spare: the culprit's node is left out, the job goes on with 2
        ([], CRASH, ALLOC, set(), 2, ("restart", ("n1", "n3"), ("n2",))),
        # a spare first: the world size stays while one is left
        ([], CRASH, ["n1", "n2"], set(), 1, ("restart", ("n1", "n3"), ("n2",))),
        # already at min_nodes: the same nodes again, as without min_nodes
        ([ended("x", 5, [("n3", "")])], CRASH, ["n1", "n2"], set(), 2, ("restart", ("n1", "n2"), ())),
        # two nodes down at once, min_nodes 1: going on with the one left
        ([], CRASH | {"node": None}, ALLOC, {"n1", "n3"}, 1, ("restart", ("n2",), ("n1", "n3"))),
        # ranks of two nodes never joined the preflight: both left out
        ([], CRASH | {"suspects": ["n2", "n3"]}, ALLOC, set(), 1, ("restart", ("n1",), ("n2", "n3"))),
        # down below min_nodes: nothing to go on with
        ([], CRASH | {"node": None}, ALLOC, {"n1", "n3"}, 2, ("no_nodes", (), ())),
    ],
)  # fmt: skip
def test_with_no_spare_left_min_nodes_goes_on_with_fewer_nodes(history, failure, nodes, down, min_nodes, want):
    decision = decide(history, failure, 1, ALLOC, nodes, restarts=2, down=down, min_nodes=min_nodes)
    assert isinstance(decision, Decision)
    assert (decision.verdict, decision.nodes, tuple(n for n, _ in decision.excluded)) == want, decision.why


def test_the_attempt_record_counts_recomputed_steps_and_recovery_time(tmp_path):
    lines = [
        {"event": "start", "attempt": 0, "nodes": ["n1", "n2"], "time": 100.0},
        {"event": "end", "attempt": 0, "nodes": ["n1", "n2"], "rank": 3, "node": "n2", "error": "killed",
         "failed_at": 160.0, "step": 120, "checkpoint": 100, "verdict": "restart", "why": "restarting",
         "excluded": [["n2", "the culprit's node"]], "time": 161.0},
        {"event": "start", "attempt": 1, "nodes": ["n1", "n3"], "time": 162.0},
    ]  # fmt: skip
    (tmp_path / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    steps = [{"event": "first_step", "step": 1, "time": 101.0}, {"event": "first_step", "step": 101, "time": 170.5}]
    (tmp_path / record_name(0)).write_text("".join(json.dumps(r) + "\n" for r in steps))
    attempts = summary(JobDir(tmp_path))
    assert [a["attempt"] for a in attempts] == [0, 1]
    assert attempts[0]["recomputed_steps"] == 20 and attempts[0]["recovery_s"] == 10.5
    text = "\n".join(format_attempts(attempts, restarts=3))
    assert "ATTEMPTS: 2 (1 of 3 restart(s) used)" in text
    assert "excluded n2: the culprit's node" in text and "20 step(s) recomputed since checkpoint 100" in text
    assert "10.5 s from the failure to the next first step" in text
    # the triage carries them to its report, its text and its exit status (a review found them dropped)
    from cluster.logs.text import format_report
    from cluster.logs.triage import inspect

    report = inspect(tmp_path, running=False)
    assert [a["attempt"] for a in report.attempts] == [0, 1] and report.flight_recorder is None
    assert "ATTEMPTS: 2" in format_report(report)


def test_ranks_that_never_joined_the_preflight_name_their_nodes(tmp_path):
    """What preflight's rank 0 printed in the attempt's log names the suspects: rank r runs on
    the attempt's node r // tasks_per_node (srun's block distribution)."""
    (tmp_path / "plan.json").write_text(json.dumps({"tasks_per_node": 2, "nodes": 3}))
    (tmp_path / preflight_log_name(0, 1)).write_text(f"preflight FAILED: {never_joined_message([2, 5])} within 20 s\n")
    failure = the_failure(JobDir(tmp_path), {"attempt": 1, "nodes": ["n1", "n3", "n4"], "time": 0.0})
    assert failure["suspects"] == ["n3", "n4"] and failure["rank"] == 2
    assert failure["error"] == "preflight: rank(s) [2, 5] never joined (on n3, n4)"


SINFO = "n1 idle*\nn2 mix*\nn3 down*\nn4 drain\nn5 alloc\nn6 fail\nn7 drng*\n"


def test_a_node_not_responding_for_a_moment_is_neither_down_nor_dead():
    """sinfo's trailing * (no answer yet) marks no node; SLURM says down after SlurmdTimeout."""
    assert nodes_in(SINFO, BAD_NODE_STATES) == {"n3", "n4", "n6", "n7"}  # left out of restarts
    assert nodes_in(SINFO, DEAD_NODE_STATES) == {"n3", "n6"}  # the guard requeues for these only


@pytest.mark.parametrize(
    "state, silent_s, lost",
    [("mix", 0, False), ("mix*", 2, False), ("alloc*", 4.9, False), ("alloc*", 5, True), ("down*", 0, True),
     ("fail", 0, True), ("drain", 0, False), ("drng", 0, False)],
)  # fmt: skip
def test_the_guard_requeues_for_a_batch_node_down_or_silent_for_half_of_slurmd_timeout(state, silent_s, lost):
    assert batch_node_lost(state, silent_s, slurmd_timeout_s=10) == lost
