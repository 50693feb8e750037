"""DCP's writing process (train.ckpt_async) never outlives its rank (issue 75): a rank SIGKILLed
while a save is in flight, under bare torchrun (nothing of the kit watches the rank: the
writer's own watch alone) and through the local launcher; the save in flight never becomes
``latest``, and the run resumes from the checkpoint before it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cluster.system.poll import wait_until
from cluster.system.processes import alive, children, command_line
from tests.conftest import ROOT, free_port, run_module
from tests.support.jobs import cancel, job_running, submit, wait_for_step
from train.contract.protocol import read_records, record_name
from train.trainer.checkpoint import latest

pytestmark = pytest.mark.slow

EVERY = 10
RUN = ["parallel.strategy=ddp", "train.log_every=5", f"train.ckpt_every={EVERY}", "train.ckpt_async=true", "train.eval_every=1000",
       "train.batch_size=32"]  # fmt: skip
WRITER_GONE_S = 10  # the bound: DCP's writer gone this soon after its rank


def writer_of(rank_pid: int) -> int:
    """The rank's DCP writer: its spawned child (multiprocessing's resource tracker is the other)."""

    def found():
        for pid in children().get(rank_pid, []):
            cmd = command_line(pid)
            if "spawn_main" in cmd and alive(pid):
                return pid

    return wait_until(found, 300, f"rank {rank_pid}'s DCP writer to start", 0.2)


def waiting_on_its_save(rank_pid: int) -> bool:
    """The rank's main thread waits for a save the (stopped) writer cannot finish: the event
    itself, read from its stack."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    dump = subprocess.run([spy, "dump", "--pid", str(rank_pid)], capture_output=True, text=True, timeout=60)
    main = dump.stdout.split("\nThread ")[1] if "\nThread " in dump.stdout else ""
    return "finish (train/trainer/checkpoint.py" in main


def kill_mid_save(records: Path, ckpt_dir: Path, running) -> tuple[int, int]:
    """SIGKILL the rank of ``records`` while its next save is in flight: its writer stopped
    (SIGSTOP, as a stalled file system would hold it) once a save is written, the rank waiting
    on a later one, then the rank killed and the writer let go. Returns the writer's pid and
    the step of the latest checkpoint at the kill. ``running()``: whether the job still runs."""

    def first_checkpoint():
        assert running(), "the job ended before its first checkpoint"
        return latest(ckpt_dir) is not None

    wait_until(first_checkpoint, 300, "a first checkpoint", 0.2)
    start = next(r for r in read_records(records) if r["event"] == "start")
    writer = writer_of(start["pid"])
    os.kill(writer, signal.SIGSTOP)
    try:

        def held() -> bool:
            """Waiting on a save the stopped writer holds: twice, with ``latest`` unchanged between
            (one stack can catch the rank passing through the finish of a save already written)."""
            before = latest(ckpt_dir)
            return (
                waiting_on_its_save(start["pid"]) and waiting_on_its_save(start["pid"]) and latest(ckpt_dir) == before
            )

        wait_until(held, 300, "the rank to wait on its save in flight", 0.5)
        published = int(latest(ckpt_dir).name.removeprefix("step_"))
        os.kill(start["pid"], signal.SIGKILL)
    finally:
        os.kill(writer, signal.SIGCONT)
    return writer, published


def assert_saves_after(records: Path, ckpt_dir: Path, published: int) -> None:
    """The save in flight stayed temporary: ``latest`` is the one published before the kill."""
    started = [r["step"] for r in read_records(records) if r["event"] == "checkpoint"]
    assert max(started) > published  # a save was in flight
    assert int(latest(ckpt_dir).name.removeprefix("step_")) == published


def torchrun_reading(run: Path) -> tuple[subprocess.Popen, list[bytes], threading.Thread]:
    """A 2-rank torchrun of the trainer, long, in ``run``; its output read through pipes, as the
    suite reads a torchrun's: their end must come once the ranks are gone (issue 75's hang: a
    writer holding them). Returns the process, its output once read, and the reader."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
            "-m", "train", f"train.run_dir={run}", "train.steps=100000", *RUN]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    return proc, out, reader


def test_a_rank_killed_mid_save_under_torchrun_takes_its_writer_and_the_run_resumes_before_it(tmp_path):
    run = tmp_path / "run"
    proc, out, reader = torchrun_reading(run)
    try:
        writer, published = kill_mid_save(run / record_name(1), run / "checkpoints", lambda: proc.poll() is None)
        wait_until(lambda: not alive(writer), WRITER_GONE_S, "rank 1's writer to end after its rank", 0.1)
        assert proc.wait(timeout=300) != 0  # torchrun ends rank 0 on rank 1's death
        reader.join(timeout=60)
        assert not reader.is_alive(), "something still holds torchrun's stdout after its ranks"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = out[0].decode(errors="replace")
    assert "DCP's writing process ends: its rank (pid" in log, log[-3000:]
    assert_saves_after(run / record_name(1), run / "checkpoints", published)

    again = run_module("torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}", "-m", "train",
                       f"train.run_dir={run}", f"train.steps={published + EVERY}", *RUN)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [r for r in read_records(run / record_name(0)) if r["event"] == "resume"]
    assert resumed[-1]["step"] == published


def test_a_rank_killed_while_its_writer_still_starts_takes_it(tmp_path):
    """Issue 75's hang: a writer that never finished its start (rank 0's, which hosts the
    writers' store, held here with SIGSTOP while it imports torch) is not yet torch's to stop,
    and reads no request, so nothing told it its rank was gone: it held torchrun's pipes."""
    run = tmp_path / "run"
    proc, out, reader = torchrun_reading(run)
    held = None
    try:
        ranks = [wait_for_step(run, rank, None, timeout=300)["pid"] for rank in (0, 1)]
        held = writer_of(ranks[0])
        os.kill(held, signal.SIGSTOP)
        starting = writer_of(ranks[1])
        os.kill(ranks[1], signal.SIGKILL)
        wait_until(lambda: not alive(starting), WRITER_GONE_S, "rank 1's starting writer to end after its rank", 0.1)
        os.kill(held, signal.SIGCONT)
        assert proc.wait(timeout=300) != 0
        reader.join(timeout=60)
        assert not reader.is_alive(), "something still holds torchrun's stdout after its ranks"
        wait_until(lambda: not alive(held), WRITER_GONE_S, "rank 0's writer to end after its rank", 0.1)
    finally:
        if held is not None and alive(held):
            os.kill(held, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "DCP's writing process ends: its rank (pid" in out[0].decode(errors="replace")


def test_a_rank_killed_mid_save_on_the_local_launcher_takes_its_writer(tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, "tasks_per_node=2", "train.steps=100000", *RUN, wait=False)
    assert result.returncode == 0, result.stderr
    job_dir = Path(info["log_dir"])
    try:
        wait_for_step(job_dir, 1, None, timeout=300)
        writer, published = kill_mid_save(
            job_dir / record_name(1), job_dir / "checkpoints", lambda: job_running(job_dir)
        )
        wait_until(lambda: not alive(writer), WRITER_GONE_S, "rank 1's writer to end after its rank", 0.1)
        wait_until(lambda: not job_running(job_dir), 300, "the job to end after its rank was killed")
    finally:
        if job_running(job_dir):
            cancel(job_dir)
    assert_saves_after(job_dir / record_name(1), job_dir / "checkpoints", published)
    report = json.loads(run_module("cluster", "logs", str(job_dir), "--json").stdout)
    assert report["first_failure"]["rank"] == 1
