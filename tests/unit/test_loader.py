"""Where the data set lives and how batches reach the loop (train/trainer/loader.py), on the CPU: the
device-resident loader and the host loader's thread yield exactly the sampler's batches. The
gpu tier runs the same comparison on CUDA (pinned buffers, side stream)."""

import threading

import pytest
import torch

from cluster.spec import JobSpec
from tests.conftest import ROOT
from train.contract.config import Config, DataConfig, ModelConfig, load
from train.rank.dist_env import DistEnv
from train.trainer.data import ShardedSampler, dataset_bytes, make_dataset
from train.trainer.loader import DEVICE_SHARE, ResidentLoader, StagedLoader, placement
from train.trainer.loop import run

SMALL = DataConfig(train_size=300, test_size=40, seed=5)
MODEL = ModelConfig(n_layers=2, dim_in=16, dim_hidden=8, n_classes=4)


def expected(data, sampler, start, steps):
    """Today's batches: the sampler's indices into the host's tensors, one by one."""
    return [
        (data.x_train[sampler.indices(s, m)], data.y_train[sampler.indices(s, m)])
        for s in range(start, steps)
        for m in range(sampler.accum)
    ]


def batches_equal(got, want) -> bool:
    return len(got) == len(want) and all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, want))


@pytest.mark.parametrize("dp_rank,dp_size,accum,start", [(0, 1, 1, 0), (1, 2, 2, 0), (2, 4, 1, 7), (0, 2, 3, 13)])
def test_the_resident_and_the_host_loader_yield_the_samplers_batches(dp_rank, dp_size, accum, start):
    """Over several epochs (300 samples, batch 48: 6 steps an epoch, 30 steps), on a data-parallel
    shard with accumulation, from a resumed step: equal tensors, in order, from both loaders."""
    data = make_dataset(SMALL, MODEL)
    batch, steps = 48, 30
    sampler = ShardedSampler(len(data.x_train), batch, 3, dp_rank, dp_size, accum)
    want = expected(data, sampler, start, steps)
    resident = ResidentLoader(data, ShardedSampler(len(data.x_train), batch, 3, dp_rank, dp_size, accum))
    staged = StagedLoader(
        data, ShardedSampler(len(data.x_train), batch, 3, dp_rank, dp_size, accum), torch.device("cpu")
    )
    assert batches_equal(list(resident.batches(start, steps)), want)
    assert batches_equal(list(staged.batches(start, steps)), want)
    staged.close()


def test_the_host_loaders_thread_stops_when_the_loop_stops_early_and_hands_on_its_errors():
    data = make_dataset(SMALL, MODEL)
    loader = StagedLoader(data, ShardedSampler(len(data.x_train), 30, 0), torch.device("cpu"))
    batches = loader.batches(0, 1000)
    next(batches), next(batches)  # the thread is ahead, blocked on its full queue
    loader.close()
    assert not loader.thread.is_alive()
    assert not any(t.name == "batch-loader" for t in threading.enumerate())

    broken = StagedLoader(data, ShardedSampler(len(data.x_train), 30, 0), torch.device("cpu"))
    broken.x = broken.x[:5]  # indices beyond the rows: index_select raises in the thread
    with pytest.raises(RuntimeError, match="batch loader's thread failed") as err:
        list(broken.batches(0, 10))
    assert isinstance(err.value.__cause__, IndexError | RuntimeError)
    broken.close()


@pytest.mark.parametrize(
    "choice,device,nbytes,total,where",
    [
        ("auto", "cpu", 10**12, None, "device"),  # the CPU's "device" is the host
        ("auto", "cuda", int(DEVICE_SHARE * 80e9), 80e9, "device"),
        ("auto", "cuda", int(DEVICE_SHARE * 80e9) + 1, 80e9, "host"),
        ("host", "cuda", 1, 80e9, "host"),
        ("device", "cuda", 10**12, 80e9, "device"),
        ("host", "cpu", 1, None, "host"),
    ],
)
def test_placement(choice, device, nbytes, total, where):
    assert placement(choice, nbytes, torch.device(device), total) == where


def test_the_bench_gpu_data_set_stays_on_an_80_gb_gpu():
    spec = load(JobSpec, ROOT / "jobs/bench_gpu.yaml")
    nbytes = dataset_bytes(spec.data, spec.model, torch.bfloat16)
    assert placement("auto", nbytes, torch.device("cuda"), 80 * 2**30) == "device"


def test_dataset_bytes_is_what_make_dataset_holds():
    for dtype in (torch.float32, torch.bfloat16):
        held = vars(make_dataset(SMALL, MODEL, dtype=dtype)).values()
        assert sum(t.numel() * t.element_size() for t in held) == dataset_bytes(SMALL, MODEL, dtype)


def test_the_cpus_data_set_is_todays_bitwise():
    """One draw on the CPU, as before the data set could live on a GPU: a job's data (and every
    figure measured with it) is unchanged by where the set is kept."""
    g = torch.Generator().manual_seed(SMALL.seed)
    centres = torch.randn(MODEL.n_classes, MODEL.dim_in, generator=g) * SMALL.separation
    y = torch.randint(MODEL.n_classes, (SMALL.train_size,), generator=g)
    x = centres[y] + torch.randn(SMALL.train_size, MODEL.dim_in, generator=g)
    data = make_dataset(SMALL, MODEL)
    assert torch.equal(data.x_train, x) and torch.equal(data.y_train, y)


def test_a_run_with_its_data_on_the_host_equals_one_with_it_on_the_device(tmp_path):
    """The whole loop, both placements (the host's with its thread), with accumulation: the same
    losses to the last bit."""
    common = ["train.steps=12", "train.log_every=6", "train.eval_every=12", "train.grad_accum=2",
              "model.dim_in=64", "data.train_size=500"]  # fmt: skip
    out = {}
    for where in ("device", "host"):
        cfg = load(
            Config,
            None,
            [*common, f"data.placement={where}", f"train.run_dir={tmp_path / where}", "train.sync_debug=true"],
        )  # a no-op on the CPU: its path runs
        record = run(cfg, DistEnv(), quiet=True)
        out[where] = (record["train_loss"], record["test_loss"])
    assert out["device"] == out["host"]
