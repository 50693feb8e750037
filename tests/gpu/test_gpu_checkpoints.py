"""The gpu tier's warm restarts and asynchronous checkpoints (issue 74): the paths that behave
otherwise on CUDA. A node's standby forks ranks that must still be able to use CUDA; an
asynchronous save copies the GPU's state to pinned host memory while a writing process beside
the rank writes the previous one. Their CPU halves run in the other tiers: the same warm restart
on the CPU (tests/processes/test_standby.py, through tests/support/warm_restart.py), the fork
check and the staging decisions (tests/unit/test_standby.py, tests/unit/test_checkpoint.py),
bench.checkpoints (tests/bench/test_gpu_bench.py).

Equality is bitwise: a restart resumes the parameters, the optimizer state, the CPU's and the
GPU's random states and the data position, and then runs the same kernels on the same shapes
on the same GPU as the uninterrupted run, in the same order (one stream), so nothing is
summed in another order; a save only reads the state."""

import os
import statistics

import pytest
import torch

from tests.support import warm_restart
from tests.support.gpu import cuda
from train.contract.protocol import read_records, record_name

GIGABYTE_STATE = ["model.dim_hidden=8192", "optim.momentum=0.9"]  # 143M parameters and their momentum: 1.15 GB


def ranks() -> int:
    """One rank per GPU, NCCL (which refuses two ranks on one device), at most 2."""
    return min(2, torch.cuda.device_count())


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("saves", ["sync", "async"])
def test_a_rank_killed_mid_run_restarts_warm_on_the_gpu_and_trains_on_bitwise_equal(saves, tmp_path):
    """A real standby as SLURM starts one (the job's and node's variables, this machine's GPUs
    visible), rank 0 killed at step 25, the next attempt's ranks through ``train.rank.standby
    run``: forked by the standby, on their GPUs over NCCL, every step's loss and the final
    parameters equal to an uninterrupted run's. Where the standby found that its fork could not
    use CUDA (an import initialised it), it says so and does not listen: the ranks start cold,
    and train on the same."""
    nprocs = ranks()
    runs = warm_restart.restart_once(tmp_path, {}, nprocs, "train.device=cuda", f"train.ckpt_async={saves == 'async'}")
    said = runs.node.log.read_text()
    for rank in range(nprocs):
        first, restart = warm_restart.starts(runs.restarted, rank)
        assert (restart["env"]["device"], restart["env"]["backend"]) == (f"cuda:{rank}", "nccl")
        assert not warm_restart.forked_by_the_standby(runs.node, first)
        assert warm_restart.forked_by_the_standby(runs.node, restart) == runs.node.warm, said
    if not runs.node.warm:
        assert "not listening: the imports initialised CUDA, which a forked rank could not use" in said
    # a synchronous save is latest at once; an asynchronous one at the next save (step 20's was in flight)
    assert warm_restart.resumed_at(runs.restarted) == [20 if saves == "sync" else 10]
    restarted, straight = warm_restart.losses(runs.restarted), warm_restart.losses(runs.straight)
    assert restarted == straight, {
        s: (restarted.get(s), straight[s]) for s in straight if restarted.get(s) != straight[s]
    }
    resumed, uninterrupted = (warm_restart.final_parameters(r) for r in (runs.restarted, runs.straight))
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def trained(where, *overrides: str) -> list[dict]:
    """One rank on cuda:0, started as a job's rank; its records. (With a strategy of a process
    group, DCP's writer is a process, as on a cluster; a one-process strategy's is a thread.)"""
    where.mkdir()
    env = warm_restart.job_env({})
    codes = warm_restart.ended(warm_restart.attempt(env, where, 0, 1, "train.device=cuda", *overrides, warm=False))
    assert codes == [0], warm_restart.tails(where)
    return list(read_records(where / record_name(0)))


@pytest.mark.gpu
@cuda
def test_an_asynchronous_save_of_a_gigabyte_of_gpu_state_trains_the_same_as_a_synchronous_one(tmp_path):
    """1.15 GB of GPU state (parameters and momentum), saved every 10 steps: synchronously, and
    asynchronously (staged to pinned host memory, written by DCP's process). The same losses at
    every step; every asynchronous save written and published. The loop's blocking time of each
    is printed (the benchmark's table is bench.checkpoints --device cuda, docs/benchmarking.md):
    speed is not asserted here."""
    shm = os.statvfs("/dev/shm")  # where the staged copy goes, shared with the writing process
    if (free := shm.f_frsize * shm.f_bavail) < 1.5e9:
        pytest.skip(f"/dev/shm has {free / 1e9:.2f} GB free: a 1.15 GB state's staged copy would not fit")
    common = [*GIGABYTE_STATE, "train.steps=40", "train.ckpt_every=10"]
    sync = trained(tmp_path / "sync", *common, "train.ckpt_async=false")
    async_ = trained(tmp_path / "async", *common, "train.ckpt_async=true")
    losses = [{r["step"]: r["train_loss"] for r in records if r["event"] == "step"} for records in (sync, async_)]
    assert losses[0] == losses[1]
    written = [r for r in async_ if r["event"] == "checkpoint_written"]
    assert [r["step"] for r in written] == [10, 20, 30, 40]
    assert not [r for r in async_ if r["event"] == "checkpoint_failed"]
    assert (tmp_path / "async" / "checkpoints" / "latest").read_text().strip() == "step_0000040"
    saved = sum(
        f.stat().st_size for f in (tmp_path / "async" / "checkpoints" / "step_0000040").rglob("*") if f.is_file()
    )
    assert saved >= 1e9
    blocked = {name: [r["seconds"] for r in records if r["event"] == "checkpoint" and r["step"] < 40]
               for name, records in (("sync", sync), ("async", async_))}  # fmt: skip
    print(f"{saved / 1e9:.2f} GB saved from {torch.cuda.get_device_name(0)}: the loop blocked "
          f"{statistics.median(blocked['sync']):.3f} s by a synchronous save, "
          f"{statistics.median(blocked['async']):.3f} s by an asynchronous one (medians of 3 saves)")  # fmt: skip


@pytest.mark.gpu
@cuda
def test_the_steady_state_stays_free_of_synchronisation_across_asynchronous_saves(tmp_path):
    """train.sync_debug (torch.cuda.set_sync_debug_mode("error"), process-wide, around every
    step but the first) while each save is written beside the loop by a thread of the same
    process (one process without a group: DCP's writer is a thread, the case that shares the
    mode; a writing process cannot): a synchronisation in a step would end the rank, one in
    the writer would fail its save. Every save written."""
    records = trained(tmp_path / "run", "parallel.strategy=single", "train.sync_debug=true", "train.ckpt_async=true",
                      "train.steps=70", "train.ckpt_every=20")  # fmt: skip
    assert [r["step"] for r in records if r["event"] == "checkpoint_written"] == [20, 40, 60, 70]
    assert not [r for r in records if r["event"] == "checkpoint_failed"]
