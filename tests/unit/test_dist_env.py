import shutil
import subprocess
import sys
import typing

import pytest

from train.contract.config import Strategy
from train.contract.protocol import master_port_for_job
from train.rank.dist_env import DistEnv, choose_device, expand_hostlist, from_environ, group_backend, torchrun_environ

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h0",
            "MASTER_PORT": "1234", "GROUP_RANK": "1"}  # fmt: skip
SLURM = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0",
         "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_JOB_ID": "4242",
         "SLURMD_NODENAME": "gpu-a08", "CUDA_VISIBLE_DEVICES": "2"}  # fmt: skip
OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "m"}  # fmt: skip
PMI = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
# The kit's local launcher: torchrun's contract, its job id (the controller's pid) for records.
LOCAL = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0",
         "MASTER_ADDR": "127.0.0.1", "KIT_JOB_ID": "999"}  # fmt: skip


def test_torchrun_contract_from_srun_variables():
    """What the rank shim exports for a script written for torchrun, from srun's variables."""
    contract = torchrun_environ(from_environ(SLURM, device=None))
    assert {k: contract[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == {
        "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}  # fmt: skip
    assert (contract["MASTER_ADDR"], contract["MASTER_PORT"]) == ("gpu-a07", str(20000 + 4242))


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, dict(launcher="none", rank=0, world_size=1, local_rank=0, node_rank=0)),
        (TORCHRUN, dict(launcher="torchrun", rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1,
                        master_addr="h0", master_port=1234)),
        (SLURM, dict(launcher="slurm", rank=6, world_size=8, local_rank=2, local_world_size=4, node_rank=1,
                     master_addr="gpu-a07", master_port=20000 + 4242, job_id="4242")),
        ({**SLURM, "SLURM_NTASKS_PER_NODE": "4", "MASTER_PORT": "777"}, dict(local_world_size=4, master_port=777)),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "3,5", "SLURM_NODEID": "1"}, dict(local_world_size=5)),
        ({**SLURM, **TORCHRUN}, dict(launcher="torchrun", rank=5)),  # torchrun inside srun: torchrun's view
        (OMPI, dict(launcher="mpi", rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1, master_addr="m")),
        (PMI, dict(launcher="mpi", rank=2, world_size=4, local_rank=0, node_rank=1)),
        (LOCAL, dict(launcher="torchrun", rank=1, world_size=3, local_rank=1, master_port=20999, job_id="999")),
    ],
)  # fmt: skip
def test_from_environ(env, want):
    got = from_environ(env, device="cpu")
    assert {k: getattr(got, k) for k in want} == want
    assert (got.backend, got.device) == ("gloo", "cpu")


@pytest.mark.parametrize(
    "local_rank, want, visible, shared_by, chosen",
    [
        (0, "auto", 0, 1, ("gloo", "cpu")),  # no GPU: the CPU
        (3, "auto", 1, 1, ("nccl", "cuda:0")),  # --gpus-per-task=1: its one GPU
        (3, "auto", 4, 1, ("nccl", "cuda:3")),  # --gres=gpu:4 shared by the node's tasks
        (3, "auto", 4, 4, ("nccl", "cuda:3")),  # torchrun --nproc-per-node=4 on 4 GPUs
        (1, "cpu", 4, 1, ("gloo", "cpu")),
        (1, "cpu", 1, 2, ("gloo", "cpu")),
        (1, "cuda", 2, 1, ("nccl", "cuda:1")),
        (0, "cuda", 0, 1, "no CUDA device is visible"),
        (2, "auto", 2, 1, "local rank 2 has no GPU: only 2 visible"),
        (1, "auto", 1, 2, "local rank 1 of 2 started by torchrun sees the same single GPU"),
        (0, "cuda", 1, 2, "NCCL needs a GPU per rank"),
    ],
)  # fmt: skip
def test_each_rank_gets_its_device_from_what_it_sees(local_rank, want, visible, shared_by, chosen):
    """train.device against the GPUs a rank sees, whatever this machine has."""
    if isinstance(chosen, str):
        with pytest.raises(RuntimeError, match=chosen):
            choose_device(local_rank, want, visible, shared_by)
    else:
        assert choose_device(local_rank, want, visible, shared_by) == chosen


def test_slurm_batch_step_is_not_a_rank():
    """The batch script itself has SLURM_PROCID=0 but is no srun task: not a distributed rank."""
    env = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    assert from_environ(env).launcher == "none"


def test_launcher_vars_are_recorded():
    assert dict(from_environ(SLURM).launcher_vars)["CUDA_VISIBLE_DEVICES"] == "2"


def test_port_rule_separates_jobs():
    ports = {master_port_for_job(j) for j in range(1000, 1100)}
    assert len(ports) == 100 and all(20000 <= p < 32000 for p in ports)  # below the ephemeral ports
    assert master_port_for_job(17186) == 25186
    assert master_port_for_job("12345_3") == master_port_for_job("123453")


HOSTLISTS = [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu-a[01-03,07],b5", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "b5"]),
    ("n[001-003]", ["n001", "n002", "n003"]),
    ("a[1-3,2-4]", ["a1", "a2", "a3", "a2", "a3", "a4"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("x,y[9-10],z", ["x", "y9", "y10", "z"]),
]


@pytest.mark.parametrize("expr, hosts", HOSTLISTS)
def test_expand_hostlist(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["n[1-2", "n[a-b]", "n]1["])
def test_malformed_hostlist(expr):
    with pytest.raises(ValueError):
        expand_hostlist(expr)


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol not installed")
@pytest.mark.parametrize("expr", [e for e, _ in HOSTLISTS if "]n[" not in e])
def test_hostlist_matches_scontrol(expr):
    """scontrol is the ground truth (it needs no running controller for this)."""
    out = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True, check=True)
    assert expand_hostlist(expr) == out.stdout.split()


def test_the_strategy_table_matches_the_schema_and_each_names_its_function():
    from train.contract.strategies import STRATEGIES, apply_function

    assert set(STRATEGIES) == set(typing.get_args(Strategy))
    assert all(apply_function(name).__name__ == f"apply_{name}" for name in STRATEGIES)


def test_native_stdout_goes_to_stderr_inside_the_block_only():
    """What C++ prints to fd 1 as a group forms (torch 2.9's gloo) must not precede ``--json``."""
    code = (
        "import os, sys\n"
        "from train.rank.dist_env import native_stdout_to_stderr\n"
        "print('before')\n"
        "with native_stdout_to_stderr():\n"
        "    os.write(1, b'[Gloo] connected\\n')\n"
        "print('after')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (result.stdout, result.stderr) == ("before\nafter\n", "[Gloo] connected\n")


@pytest.mark.parametrize(
    "backend, host_collectives, want",
    [("nccl", True, "cpu:gloo,cuda:nccl"), ("nccl", False, "nccl"), ("gloo", True, "gloo"), ("gloo", False, "gloo")],
)
def test_a_gpu_group_that_saves_asynchronously_has_gloo_beside_nccl(backend, host_collectives, want):
    """DCP's async_save refuses a group without a CPU backend: a NCCL rank with train.ckpt_async
    joins with gloo beside NCCL (the gpu tier saves so); a CPU rank's gloo is one already."""
    assert group_backend(DistEnv(backend=backend), host_collectives) == want
