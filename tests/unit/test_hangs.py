"""Hangs: stacks in every rank's log, the stall watchdog, and the inspector's culprit.

Unit tests use log text shaped exactly like real faulthandler dumps and tracebacks (copied
from real runs); the slow ones make real hangs with the training module's debug switches."""

import os
import pickle
from pathlib import Path

import pytest

from cluster.jobdir import JobDir
from cluster.logs import stacks
from cluster.logs.triage import inspect
from tests.conftest import run_module
from train.contract.protocol import FLIGHT_RECORDER_PREFIX

SITE = "/venv/lib/python3.11/site-packages"


OUTER = [
    '  File "/kit/train/loop.py", line 121 in run',
    '  File "/kit/train/trainer/rank_life.py", line 40 in run_rank',
    f'  File "{SITE}/submitit/core/_submit.py", line 11 in <module>',
    '  File "<frozen runpy>", line 198 in _run_module_as_main',
]


WAITING = [
    f'  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward',
    f'  File "{SITE}/torch/_tensor.py", line 623 in backward',
    '  File "/kit/train/loop.py", line 141 in forward_backward',
    '  File "/kit/train/loop.py", line 180 in train',
]


HUNG = ['  File "/kit/train/faults.py", line 24 in hang_here', '  File "/kit/train/loop.py", line 175 in train']


HELPER_THREAD = [
    f'  File "{SITE}/../threading.py", line 320 in wait',
    '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap',
]


def dump(frames: list[str], header: str = "", helper: bool = True) -> str:
    """A faulthandler dump: optional "Timeout (...)!" line, a helper thread, the main thread."""
    lines = [header] if header else []
    if helper:
        lines += ["Thread 0x00007f20e1e3cb81 (most recent call first):", *HELPER_THREAD, ""]
    lines += ["Thread 0x00007f20e1e3cb80 (most recent call first):", *frames, *OUTER, ""]
    return "\n".join(lines) + "\n"


def log(path: Path, *chunks: str) -> Path:
    text = "2026-01-01T12:00:00.000 rank 0/4 on node0\n2026-01-01T12:00:01.000 step 15/100 ...\n"
    path.write_text(text + "".join(chunks))
    return path


def test_last_stack_reads_the_main_thread_of_a_watchdog_dump(tmp_path):
    stack = stacks.last_stack(log(tmp_path / "r.log", dump(HUNG, "Timeout (0:00:12.500000)!")))
    assert stack.kind == "stall"
    assert stack.frames[0] == stacks.Frame("/kit/train/faults.py", 24, "hang_here")
    assert stack.waiting_in() is None and stack.where() == "at /kit/train/faults.py:24 in hang_here"


def test_last_stack_of_a_traceback_is_innermost_first_and_sees_the_collective(tmp_path):
    tb = (
        "2026-01-01T12:00:02.000 Traceback (most recent call last):\n"
        '2026-01-01T12:00:02.000   File "/kit/train/loop.py", line 189, in train\n'
        "2026-01-01T12:00:02.000     trainable.finish_grads()\n"
        f'2026-01-01T12:00:02.000   File "{SITE}/torch/distributed/distributed_c10d.py", line 3245, in all_reduce\n'
        "2026-01-01T12:00:02.000     work = group.allreduce([tensor], opts)\n"
        f'2026-01-01T12:00:02.000   File "{SITE}/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
        "2026-01-01T12:00:02.000 RuntimeError: Connection closed by peer\n"
    )
    stack = stacks.last_stack(log(tmp_path / "r.log", dump(HUNG, "Timeout (0:00:10)!"), tb))
    assert stack.kind == "traceback" and stack.frames[-1].func == "train"
    assert stack.waiting_in() == "all_reduce"  # the API the code called, not torch's logging wrapper
    assert stack.where() == "waiting in all_reduce at /kit/train/loop.py:189 in train"


def test_snapshot_offset_ignores_older_dumps(tmp_path):
    path = log(tmp_path / "r.log", dump(WAITING))
    assert stacks.last_stack(path, since=path.stat().st_size) is None
    with path.open("a") as f:
        f.write(dump(HUNG, helper=False))
    assert stacks.last_stack(path).frames[0].func == "hang_here"


def test_a_dump_read_while_it_is_written_is_not_whole(tmp_path):
    """A snapshot polls the logs while ranks write their dumps: one cut off before the main
    thread's entry point is not yet the rank's answer (its frames would misplace the rank)."""
    whole = dump(WAITING)
    assert stacks.last_stack(log(tmp_path / "w.log", whole)).whole
    helper_only = whole[: whole.index("Thread 0x00007f20e1e3cb80")]
    main_begun = whole[: whole.index(OUTER[0])]
    for cut in (helper_only, main_begun):
        assert not stacks.last_stack(log(tmp_path / "c.log", cut)).whole


def test_a_watchdog_dump_after_a_snapshot_makes_the_rank_stalled(tmp_path):
    """A snapshot's dump comes first in a hung rank's log; the watchdog's last one decides."""
    from cluster.logs.scan import scan_log

    scan = scan_log(log(tmp_path / "r.log", dump(HUNG), dump(HUNG, "Timeout (0:00:25)!")))
    assert scan["stalled"] == "Timeout (0:00:25)!" and scan["error"] is None
    assert scan["dump_frames"][-1] == 'File "/kit/train/faults.py", line 24 in hang_here'  # innermost last
    assert scan_log(log(tmp_path / "s.log", dump(HUNG)))["stalled"] is None  # a snapshot alone


@pytest.mark.parametrize(
    "where, errors, culprits, reason",
    [
        # watchdog stall: the only rank outside a collective
        ({0: WAITING, 1: WAITING, 2: HUNG, 3: WAITING}, {}, [2], "not inside a collective"),
        # ranks 0,1 died of the cascade (their error says so, no torch frame needed)
        (
            {0: HUNG[:1], 1: HUNG[:1], 2: HUNG, 3: WAITING},
            {0: "Connection closed by peer", 1: "Connection closed by peer"},
            [2],
            "not inside a collective",
        ),  # fmt: skip
        # all in collectives, one in another one: the minority frame
        (
            {0: WAITING, 1: WAITING, 2: WAITING[:2] + ['  File "/kit/train/loop.py", line 99 in flush'], 3: WAITING},
            {},
            [2],
            "majority",
        ),  # fmt: skip
        # torch's monitored barrier names the rank, whatever the stacks say
        (
            {0: WAITING, 1: WAITING},
            {0: "RuntimeError: [Rank 0]: Ranks 3, 5 failed to pass monitoredBarrier in 15000 ms"},
            [3, 5],
            "TORCH_DISTRIBUTED_DEBUG",
        ),  # fmt: skip
    ],
)
def test_classify_names_the_culprit(tmp_path, where, errors, culprits, reason):
    found = {}
    for rank, frames in where.items():
        found[rank] = stacks.last_stack(log(tmp_path / f"{rank}.log", dump(frames, "Timeout (0:00:10)!")))
    verdict = stacks.classify(found, errors)
    assert verdict["culprits"] == culprits and reason in verdict["reason"]


def fingerprint(rank: int, shape: str) -> str:
    return (
        f"Rank {rank} is running collective: CollectiveFingerPrint(SequenceNumber=81, OpType=ALLREDUCE, "
        f"TensorShape=[{shape}], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float))"
    )


def test_mismatch_names_the_minority_and_a_tie_names_both():
    big, odd = "256, 1024", "3, 3"
    errors = {r: f"RuntimeError: Detected mismatch between collectives on ranks. {fingerprint(r, big)}, but "
                 f"{fingerprint(1, odd)}" for r in (0, 2, 3)}  # fmt: skip
    errors[1] = (
        f"RuntimeError: Detected mismatch between collectives on ranks. {fingerprint(1, odd)}, but {fingerprint(0, big)}"
    )
    culprits, message = stacks.named_by_messages(errors)
    assert culprits == [1] and "rank(s) 1 ran ALLREDUCE of shape [3, 3]" in message
    two = {0: f"Detected mismatch between collectives on ranks. {fingerprint(0, big)}, but {fingerprint(1, odd)}"}
    assert stacks.named_by_messages(two)[0] == [0, 1]


def test_no_verdict_for_an_ordinary_crash(tmp_path):
    found = {0: stacks.last_stack(log(tmp_path / "0.log", dump(WAITING)))}
    assert stacks.classify(found, {0: "ValueError: shapes do not match"}) is None


def test_flight_recorder_names_ranks_behind(tmp_path):
    for rank, seq in [(0, 12), (1, 12), (2, 11), (3, 12)]:
        entries = [{"collective_seq_id": s, "profiling_name": "nccl:all_reduce"} for s in range(1, seq + 1)]
        (tmp_path / f"{FLIGHT_RECORDER_PREFIX}{rank}").write_bytes(pickle.dumps({"entries": entries}))
    assert stacks.flight_recorder(JobDir(tmp_path).flight_recorder_files()) == {
        "last_seq": {0: 12, 1: 12, 2: 11, 3: 12},
        "max_seq": 12,
        "behind": {2: 11},
    }


class RunsCode:
    """What a rank could write into a flight-recorder dump: loading it would run a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_flight_recorder_dump_is_read_as_plain_data_never_run(tmp_path):
    """A job directory is data to its readers: a dump that names a class or a function is
    skipped, not loaded, and the readers go on with the others."""
    marker = tmp_path / "ran"
    (tmp_path / f"{FLIGHT_RECORDER_PREFIX}0").write_bytes(pickle.dumps({"entries": [{"collective_seq_id": 3}]}))
    (tmp_path / f"{FLIGHT_RECORDER_PREFIX}1").write_bytes(pickle.dumps({"entries": [RunsCode(marker)]}))
    assert stacks.flight_recorder(JobDir(tmp_path).flight_recorder_files())["last_seq"] == {0: 3}
    assert not marker.exists()
    (tmp_path / "submitit").mkdir()
    JobDir(tmp_path).function_result(0).write_bytes(pickle.dumps(("success", RunsCode(marker))))
    assert JobDir(tmp_path).function_outcome(0, plain=True) == ("unreadable", None) and not marker.exists()


def test_inspector_report_of_a_synthetic_stall(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    for rank in range(4):
        log(job / f"rank_{rank:05d}.log", dump(HUNG if rank == 2 else WAITING, "Timeout (0:00:12.500000)!"))
    report = inspect(job, running=False)
    assert [r.state for r in report.ranks] == ["stalled"] * 4
    assert report.first_failure["rank"] == 2 and "hang_here" in report.first_failure["error"]
    assert report.hang["culprits"] == [2]
    assert [g["ranks"] for g in report.hang["groups"]] == [[0, 1, 3], [2]]
    assert report.cascade == {"stall watchdog fired": [0, 1, 3]}


def test_ranks_killed_by_fail_fast_while_handling_a_peers_failure_do_not_hide_the_culprit(tmp_path):
    """The launcher ends the job when the first watchdog fires: rank 1 is killed while printing
    its own cascade error (no evidence), rank 3 after printing one (waiting). Rank 2 is named."""
    job = tmp_path / "job"
    job.mkdir()
    stall = "Timeout (0:00:12.500000)!"
    printing = ['  File "/usr/lib/python3.11/traceback.py", line 180 in print_exc',
                '  File "/kit/train/trainer/rank_life.py", line 49 in run_rank']  # fmt: skip
    cascade = (
        "2026-01-01T12:00:02.000 Traceback (most recent call last):\n"
        '2026-01-01T12:00:02.000   File "/kit/train/loop.py", line 149, in forward_backward\n'
        "2026-01-01T12:00:02.000 RuntimeError: Connection closed by peer [127.0.0.1]:26814\n"
    )
    log(job / "rank_00000.log", dump(WAITING, stall))
    log(job / "rank_00001.log", "2026-01-01T12:00:02.000 rank 1 failed on vm:\n", dump(printing, helper=False))
    log(job / "rank_00002.log", dump(HUNG, stall))
    log(job / "rank_00003.log", cascade, dump(['  File "/kit/train/__main__.py", line 52 in main'], helper=False))
    report = inspect(job, running=False)
    assert [r.state for r in report.ranks] == ["stalled", "killed", "stalled", "failed"]
    assert report.hang["culprits"] == [2] and report.first_failure["rank"] == 2


@pytest.mark.parametrize(
    "said, caught",
    [
        ("2026-01-01T12:00:02.000 rank 0 failed on vm:\n",
         ['  File "/usr/lib/python3.11/traceback.py", line 180 in print_exc',
          '  File "/kit/train/rank/shim.py", line 137 in run_python']),
        ("", ['  File "/kit/train/rank/shim.py", line 137 in run_python']),
    ],
    ids=["printing the error", "before printing it"],
)  # fmt: skip
def test_a_rank_killed_while_handling_a_peers_failure_waited_for_a_rank_stalled_outside_collectives(
    said, caught, tmp_path
):
    """Seen under load with 2 ranks: rank 1's start-up limit fired in the script's own code and
    rank 1 exited; rank 0's all_reduce broke, and the launcher's SIGTERM caught rank 0 printing
    that error, or (in CI) in the shim's ``except`` before it printed a line: no error line, no
    frame of the collective. Rank 0 had been waiting for rank 1, the only stall, which stopped
    outside any collective: rank 1 is named."""
    job = tmp_path / "job"
    job.mkdir()
    log(job / "rank_00000.log", said, dump(caught, helper=False))
    log(job / "rank_00001.log", dump(HUNG, "Timeout (0:00:20)!"))
    report = inspect(job, running=False)
    assert [r.state for r in report.ranks] == ["killed", "stalled"]
    assert report.hang["culprits"] == [1] and report.first_failure["rank"] == 1
    assert report.hang["groups"][0] == {
        "frame": "waiting until a peer's failure reached it, then killed at /kit/train/rank/shim.py:137 in run_python",
        "ranks": [0],
        "waiting": True,
    }


def test_debug_collectives_with_torch_ddp_on_gloo_is_refused_before_it_crashes():
    result = run_module("train", "parallel.strategy=ddp", "train.debug_collectives=true", "train.steps=1")
    assert result.returncode == 2 and "train.debug_collectives" in result.stderr
