import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, run_module
from tests.support.checkpoint import params_after
from tests.support.strategies import max_diff
from train.contract.config import Config, load
from train.contract.protocol import CHECKPOINTS, latest_checkpoint_step, read_records
from train.rank.dist_env import DistEnv
from train.trainer import checkpoint
from train.trainer.loop import setup


@pytest.mark.parametrize("how", [[], ["train.ckpt_async=true"], ["train.ckpt_async=true", "parallel.strategy=model_parallel"]],
                         ids=["sync", "async", "async-model_parallel"])  # fmt: skip
def test_resume_is_bitwise_identical(tmp_path, how):
    """One process (no process group: an asynchronous save writes from a thread, DCP's own)."""
    straight = params_after(tmp_path / "a", 40, *how)
    params_after(tmp_path / "b", 20, *how)  # stops at 20 with a checkpoint ...
    resumed = params_after(tmp_path / "b", 40, *how)  # ... and the next run picks it up
    assert max_diff(straight, resumed) == 0.0
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text().strip() == "step_0000040"
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "latest", "step_0000010", "step_0000020", "step_0000030", "step_0000040"]  # fmt: skip


def test_a_latest_checkpoint_that_does_not_load_is_passed_over_for_the_one_before(tmp_path):
    """A latest checkpoint whose files are damaged (DCP's metadata overwritten, as a full disk
    or a bad copy leaves it) is passed over, said, for the previous one; the run ends as one
    never stopped. With every checkpoint damaged, the run stops instead of training on from
    a state that may hold part of one."""
    straight = params_after(tmp_path / "a", 40)
    params_after(tmp_path / "b", 30)
    ckpt = tmp_path / "b" / CHECKPOINTS
    (ckpt / "step_0000030" / ".metadata").write_bytes(b"not a checkpoint")
    resumed = params_after(tmp_path / "b", 40)
    assert max_diff(straight, resumed) == 0.0
    resumes = [r for r in read_records(tmp_path / "b" / "rank_00000.jsonl") if r["event"] == "resume"]
    assert [(r["step"], r["passed_over"]) for r in resumes] == [(20, ["step_0000030"])]
    for step in (10, 20, 30, 40):
        (ckpt / f"step_{step:07d}" / ".metadata").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="no checkpoint in .* loads \\(tried step_0000040, step_0000030"):
        params_after(tmp_path / "b", 50)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_during_save_leaves_previous_checkpoint(tmp_path, mode):
    """Killed in the middle of saving step 20 (an asynchronous save: staged, its write in
    flight in DCP's own process): step 10 stays latest, and step 20 is saved over the debris."""
    flags = ["--async"] if mode == "async" else []
    with subprocess.Popen([sys.executable, "-m", "tests.support.ckpt_killer", str(tmp_path), *flags], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True) as proc:  # fmt: skip
        assert proc.stdout.readline().strip() == "saving"
        proc.send_signal(signal.SIGKILL)
    ckpt = tmp_path / "checkpoints"
    assert (ckpt / "step_0000020.tmp").is_dir() and not (ckpt / "step_0000020").exists()
    assert checkpoint.latest(ckpt) == ckpt / "step_0000010"
    cfg = load(Config, None, [f"train.run_dir={tmp_path}"])
    trainable, _ = setup(cfg, DistEnv())
    assert checkpoint.load(ckpt / "step_0000010", trainable, None) == 10
    # and the next save of step 20 replaces the debris
    checkpoint.save(ckpt, 20, trainable, None)
    assert checkpoint.latest(ckpt) == ckpt / "step_0000020" and not (ckpt / "step_0000020.tmp").exists()
    assert torch.load(ckpt / "step_0000020" / "extra_rank00000.pt", weights_only=False)["step"] == 20


def test_a_non_finite_state_is_never_saved_and_latest_stays_finite(tmp_path):
    """lr 50 with momentum: the loss is finite up to step 4 and nan from step 5 (logged only at
    step 40). The checkpoint of step 5 is refused (its loss and parameters are checked on every rank) and the run stops
    there: ``latest`` is step 4."""
    result = run_module("train", "parallel.strategy=single", "optim.lr=50", "optim.momentum=0.9", "train.steps=40",
                        "train.ckpt_every=1", "train.log_every=40", f"train.run_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 1 and "the state at step 5 is non-finite" in result.stderr, result.stderr[-2000:]
    assert (
        latest_checkpoint_step(tmp_path / CHECKPOINTS) == 4 and not (tmp_path / CHECKPOINTS / "step_0000005").exists()
    )
    extra = torch.load(tmp_path / "checkpoints" / "step_0000004" / "extra_rank00000.pt", weights_only=False)
    assert extra["step"] == 4


def test_a_writer_that_does_not_start_is_agreed_on_and_every_rank_saves_synchronously(tmp_path):
    """The warm-up's writer never started (issue 75: a peer's writer could not bind its port, and
    this one waited for it): past the limit, finish says so as a Written of step None, once every
    rank agreed (here one rank: ``ok_everywhere`` passes its flag on); the caller saves
    synchronously from then on. Where every rank's writer started, nothing is said."""
    from concurrent.futures import Future

    saver = checkpoint.AsyncSaver(tmp_path, torch.device("cpu"), start_limit_s=0.05)
    never = Future()  # a writer still starting: its future never completes
    saver.pending = (None, never, None, 0.0)
    agreed = []
    written = saver.finish(lambda ok: agreed.append(ok) or ok)
    assert agreed == [False] and written.step is None and "did not start in 0 s" in written.error
    started = Future()
    started.set_result(None)
    saver.pending = (None, started, None, 0.0)
    assert saver.finish(lambda ok: ok) is None
    saver.pending = (None, started, None, 0.0)  # this rank's started, another's did not
    assert saver.finish(lambda ok: False).error == "another rank's writing process did not start"
    saver.close()


def test_the_writers_port_is_free_and_below_the_ephemeral_range():
    """DCP's writers meet on a port no outgoing connection takes between its pick and its bind."""
    from train.trainer import dcp_writer

    low = int(open(dcp_writer.EPHEMERAL_RANGE).read().split()[0])
    port = dcp_writer.port_below_ephemeral()
    assert low - dcp_writer.PORTS_BELOW <= port < low


def test_the_watched_writer_is_torchs_own_where_this_torch_has_one():
    """install() puts the kit's writer in torch's place, once, and the port picker beside it."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    from train.trainer import dcp_writer

    assert dcp_writer.install() and dcp_writer.install()
    watched = executor._AsyncCheckpointProcess
    assert watched._kit_watched.__name__ == "_AsyncCheckpointProcess" and issubclass(watched, watched._kit_watched)
    assert (
        watched._checkpointing_subprocess is dcp_writer._serve
        and executor.get_free_port is dcp_writer.port_below_ephemeral
    )


def test_the_loop_saves_synchronously_once_a_writer_did_not_start(tmp_path):
    """The trainer's side of the agreement: the warm-up's writer never started (its future never
    completes), so the first save records that asynchronous saves are off and writes its
    checkpoint synchronously, at once; the saver is gone."""
    from concurrent.futures import Future

    from train.contract.protocol import RecordWriter, read_records
    from train.trainer.loop import Checkpointer, LossMeter, Outlets
    from train.trainer.tensorboard import Board

    cfg = load(Config, None, [f"train.run_dir={tmp_path}", "train.ckpt_async=true", "train.stall_timeout_s=0.1"])
    trainable, ctx = setup(cfg, DistEnv())
    writer = RecordWriter(tmp_path, 0)
    ckpt = Checkpointer(ctx, trainable, None, Outlets(writer, Board(tmp_path, False), print))
    assert ckpt.saver.start_limit_s == 0.05  # half the stall watchdog's
    ckpt.saver.close()  # its real warm-up's writer: a thread here (one process), ended
    ckpt.saver.pending = (None, Future(), None, 0.0)
    ckpt.save(10, LossMeter(torch.device("cpu"), 1), distributed=False)
    assert ckpt.saver is None and checkpoint.latest(tmp_path / "checkpoints").name == "step_0000010"
    records = list(read_records(writer.path))
    assert [r["event"] for r in records] == ["checkpoint_failed", "checkpoint"]
    assert "did not start in 0 s" in records[0]["error"] and "asynchronous" not in records[1]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_save_is_staged_pinned_and_non_blocking_from_a_gpu_and_shared_in_the_loops_thread(device):
    """The staging decisions, made for either device here (the GPU's stager itself is built and
    used by the gpu tier): a GPU's state goes to pinned buffers by non-blocking copies, waited
    for once; on either device the copy is shared memory (the writing process reads it in
    place) and made in the loop's own thread (use_async_staging off: the next step waits)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    options = checkpoint.staging(torch.device(device))
    assert options == {"use_pinned_memory": device == "cuda", "use_shared_memory": True,
                       "use_async_staging": False, "use_non_blocking_copy": device == "cuda"}  # fmt: skip
    if device == "cpu":  # a GPU's stager asserts a GPU: made and used in the gpu tier
        DefaultStager(StagingOptions(**options)).close()
    # and the writer of a state in host memory copies nothing ahead from a GPU (a stream of its own,
    # synchronised in the writing thread: a failed save under train.sync_debug)
    assert checkpoint.writer(Path("ckpt")).per_thread_copy_ahead == 0


def test_a_ranks_own_part_is_copied_to_host_memory_for_a_write_beside_the_loop():
    """extras(copy=True), what an asynchronous save writes from a thread while the loop trains:
    every tensor of the nested state equal and a copy of its own (on a GPU, the device-to-host
    copy), none shared with the live state that the next optimizer step changes."""
    live = {"step": 7, "rng": torch.get_rng_state(), "optimizer_shard": {"state": {0: {"momentum": torch.ones(3)}}},
            "layout": {"dp": 2}, "pair": (torch.zeros(2), [torch.arange(4)])}  # fmt: skip
    staged = checkpoint._to_host(live)
    assert staged["step"] == 7 and staged["layout"] == {"dp": 2} and isinstance(staged["pair"], tuple)
    pairs = [(staged["rng"], live["rng"]), (staged["pair"][0], live["pair"][0]), (staged["pair"][1][0], live["pair"][1][0]),
             (staged["optimizer_shard"]["state"][0]["momentum"], live["optimizer_shard"]["state"][0]["momentum"])]  # fmt: skip
    for copy, original in pairs:
        assert torch.equal(copy, original) and copy.device.type == "cpu" and copy.data_ptr() != original.data_ptr()
