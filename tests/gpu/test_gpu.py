"""The GPU tier (``-m gpu``, ``make gpu-check``): the paths that run only on CUDA, run where
CUDA is present and skipped with the reason printed elsewhere. Their CPU-side parts are
exercised in the fast tier (tests/unit/test_precision.py); the MFU benchmark's, with its
GPU run, in tests/bench/test_gpu_bench.py.

Tolerances, float32 on the GPU: NCCL's all-reduce and cuBLAS pick kernels by shape (a rank's
half batch is another shape than the whole), so the sums of a gradient are ordered
differently than in one process, a few ulps per step over 20 steps: ``GPU_ATOL = 1e-5`` is
the CPU bound's 1e-6 with 10x for kernel choice, still 100x below a missing division by the
world size (1e-3 after one step). bf16 keeps 8 bits of mantissa (relative rounding 4e-3):
after 20 steps its loss is within ``LOW_PRECISION_RTOL = 5%`` of fp32's, and must differ
from it (else autocast or the policy did nothing); fp16 with the GradScaler likewise."""

import json

import pytest
import torch

from tests.conftest import ROOT, docker_engine, torchrun
from tests.support.gpu import cuda
from tests.support.jobs import submit
from tests.support.strategies import BASE, max_diff, run_strategy, train_here
from train.contract.config import Config, load
from train.contract.protocol import read_records, record_name
from train.rank.dist_env import DistEnv
from train.trainer.parallel.common import full_parameters

GPU_ATOL = 1e-5


LOW_PRECISION_RTOL = 0.05


def one_gpu_run(tmp_path, *overrides) -> tuple[dict, dict]:
    """(final parameters, last step record) of one process on cuda:0."""
    trainable, record = train_here(*BASE, "train.device=cuda", f"train.run_dir={tmp_path / 'one'}", *overrides,
                                   env=DistEnv(device="cuda:0"))  # fmt: skip
    return full_parameters(trainable), record


@pytest.mark.gpu
@cuda
def test_nccl_ddp_matches_one_gpu(tmp_path):
    nprocs = min(2, torch.cuda.device_count())
    reference, _ = one_gpu_run(tmp_path)
    params, _, records = run_strategy(tmp_path, nprocs, "parallel.strategy=ddp", "train.device=cuda")
    assert records[0][0]["env"]["backend"] == "nccl"
    for p in params:
        assert max_diff(p, reference) < GPU_ATOL


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_and_the_grad_scaler_train_close_to_fp32(precision, tmp_path):
    """bf16 autocast, and fp16 autocast with the GradScaler (its state is checkpointed)."""
    _, fp32 = one_gpu_run(tmp_path / "fp32")
    _, low = one_gpu_run(tmp_path / precision, f"train.precision={precision}", "train.ckpt_every=20")
    assert low["train_loss"] != fp32["train_loss"]
    assert abs(low["train_loss"] - fp32["train_loss"]) <= LOW_PRECISION_RTOL * fp32["train_loss"]
    extra = torch.load(tmp_path / precision / "one" / "checkpoints" / "step_0000020" / "extra_rank00000.pt",
                       weights_only=False)  # fmt: skip
    assert (extra["scaler"] is not None) == (precision == "fp16")


@pytest.mark.gpu
@cuda
def test_fsdp_mixed_precision_policy_trains_close_to_fp32(tmp_path):
    """FSDP's own policy (bf16 compute, fp32 gradient reduction) over NCCL."""
    _, fp32 = one_gpu_run(tmp_path / "fp32")
    nprocs = min(2, torch.cuda.device_count())
    _, _, records = run_strategy(
        tmp_path, nprocs, "parallel.strategy=fsdp", "train.precision=bf16", "train.device=cuda"
    )
    low = [r for r in records[0] if r["event"] == "step"][-1]
    assert low["train_loss"] != fp32["train_loss"]
    assert abs(low["train_loss"] - fp32["train_loss"]) <= LOW_PRECISION_RTOL * fp32["train_loss"]


@pytest.mark.gpu
@cuda
def test_a_gpu_job_through_the_local_launcher_names_its_device(tmp_path):
    result, info = submit(str(ROOT / "jobs/single_gpu.yaml"), tmp_path, "cluster=local", "train.steps=50")
    assert result.returncode == 0, result.stdout[-3000:]
    log = (tmp_path / "single-gpu" / info["job_id"] / "rank_00000.log").read_text()
    assert "device cuda:0" in log


@pytest.mark.gpu
@cuda
def test_preflight_checks_every_collective_over_nccl():
    """torchrun's ranks see every GPU of the node: each binds its own before NCCL meets
    (on one GPU, one rank: NCCL refuses two ranks on one device)."""
    nprocs = min(2, torch.cuda.device_count())
    result = torchrun(nprocs, "train.preflight", "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    verdict = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"ok"')))
    assert verdict["ok"] and verdict["world_size"] == nprocs
    assert [facts["device"] for facts in verdict["ranks"]] == [f"cuda:{rank}" for rank in range(nprocs)]


@pytest.mark.gpu
@cuda
def test_gpu_node_containers_train_on_their_own_gpus(tmp_path):
    """cluster=docker with GPUs: node n's container gets this machine's GPU n (a device
    request), where it is cuda:0, and the ranks meet over NCCL, across two containers where
    there are two GPUs. Needs an engine with the NVIDIA container toolkit and the CUDA image."""
    engine, image = docker_engine(), "torch-cluster-kit:latest"
    if engine is None:
        pytest.skip("no Docker engine answers here (or no Docker SDK in this interpreter): GPU containers not checked")
    if not engine.images.list(name=image):
        pytest.skip(f"no {image} here (make build): GPU containers not checked")
    nodes = min(2, torch.cuda.device_count())
    result, info = submit(str(ROOT / "jobs/docker.yaml"), tmp_path, f"nodes={nodes}", "tasks_per_node=1",
                          "gpus_per_node=1", "train.steps=50", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(nodes):
        start = next(read_records(f"{info['log_dir']}/{record_name(rank)}"))
        assert (start["env"]["device"], start["env"]["backend"]) == ("cuda:0", "nccl")
        assert start["env"]["launcher_vars"]["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.gpu
@cuda
def test_the_loaders_yield_the_samplers_batches_on_cuda():
    """The CPU test's comparison on CUDA: the data set on the device with indices there, and on
    the host through pinned buffers and a side stream, against the host's own gather."""
    from tests.unit.test_loader import MODEL, SMALL, batches_equal, expected
    from train.trainer.data import ShardedSampler, make_dataset
    from train.trainer.loader import ResidentLoader, StagedLoader

    device = torch.device("cuda:0")
    host = make_dataset(SMALL, MODEL, device, store="cpu")
    on_device = make_dataset(SMALL, MODEL, device)
    assert torch.equal(host.x_train, on_device.x_train.cpu())  # drawn in chunks: the same wherever kept
    for dp_rank, dp_size, accum, start in [(0, 1, 1, 0), (1, 2, 2, 5)]:
        want = expected(host, ShardedSampler(300, 48, 3, dp_rank, dp_size, accum), start, 30)
        resident = ResidentLoader(on_device, ShardedSampler(300, 48, 3, dp_rank, dp_size, accum, device))
        staged = StagedLoader(host, ShardedSampler(300, 48, 3, dp_rank, dp_size, accum), device)
        for loader in (resident, staged):
            got = [(x.cpu(), y.cpu()) for x, y in loader.batches(start, 30)]
            loader.close()
            assert batches_equal(got, want), type(loader).__name__


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16_params"])
@pytest.mark.parametrize("placement", ["device", "host"])
def test_the_steady_state_steps_never_synchronise(precision, placement, tmp_path):
    """train.sync_debug: torch.cuda.set_sync_debug_mode("error") around every step but the first
    and the log steps; 70 steps cross two epochs (the permutation's copy) and both loaders."""
    one_gpu_run(tmp_path, f"train.precision={precision}", f"data.placement={placement}", "train.sync_debug=true",
                "train.steps=70", "train.log_every=70", "train.eval_every=70", "data.train_size=2000",
                "train.batch_size=64")  # fmt: skip


@pytest.mark.gpu
@cuda
def test_bf16_parameters_train_close_to_fp32_on_the_gpu(tmp_path):
    """bf16 parameters, gradients and momentum with the fused SGD step, no autocast: within
    LOW_PRECISION_RTOL of fp32 after the same steps, and not equal to it."""
    _, fp32 = one_gpu_run(tmp_path / "fp32")
    params, low = one_gpu_run(tmp_path / "bf16p", "train.precision=bf16_params")
    assert {v.dtype for v in params.values()} == {torch.bfloat16}
    assert low["train_loss"] != fp32["train_loss"]
    assert abs(low["train_loss"] - fp32["train_loss"]) <= LOW_PRECISION_RTOL * fp32["train_loss"]


@pytest.mark.gpu
@cuda
def test_train_compile_on_the_gpu(tmp_path):
    _, eager = one_gpu_run(tmp_path / "eager", "optim.momentum=0")
    _, compiled = one_gpu_run(tmp_path / "compiled", "optim.momentum=0", "train.compile=true")
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-3)


@pytest.mark.gpu
@cuda
def test_initial_weights_and_data_are_bitwise_equal_across_gpu_processes(tmp_path):
    """Built on the GPU from the seed: the same bytes in every rank (one per GPU, at most 2)
    and in this process."""
    from tests.support.dist_worker import probe_init

    nprocs = min(2, torch.cuda.device_count())
    _, probes, _ = run_strategy(tmp_path, nprocs, "parallel.strategy=param_avg", "train.device=cuda",
                                flags=["--probe-init"])  # fmt: skip
    mine = probe_init(load(Config, None, [*BASE, "train.device=cuda"]), DistEnv(device="cuda:0"))
    assert all(p["weights_sha256"] == mine["weights_sha256"] and p["data_sha256"] == mine["data_sha256"]
               for p in probes)  # fmt: skip
