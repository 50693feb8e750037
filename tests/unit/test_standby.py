"""What a node's standby (``train.rank.standby``) starts warm, and where it listens. (A real standby
forking real ranks: tests/processes/test_standby.py; in a job: the SLURM tier's restarts.)"""

import os
import socket
import sys

import pytest

from train.rank import standby
from train.rank.standby import address, fork_is_clean, warm_command


@pytest.mark.parametrize(
    "argv, module",
    [
        ([sys.executable, "-P", "-m", "train", "--timestamps"], "train"),
        ([sys.executable, "-P", "-m", "train.rank.shim", "--job-dir=/j", "--", "-x"], "train.rank.shim"),
        ([sys.executable, "-m", "train"], None),  # not -P: its sys.path would differ from the standby's
        ([sys.executable, "-P", "-c", "print(1)"], None),
        (["/bin/sh", "-P", "-m", "train"], None),  # another interpreter
        ([sys.executable, "-P", "-m"], None),
    ],
)
def test_only_what_a_fork_of_the_standby_runs_the_same_is_started_warm(argv, module):
    assert warm_command(argv) == module


def test_a_standby_listens_per_job_and_node_in_the_abstract_namespace():
    assert address({"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n2"}) == "\0cluster-kit-standby:77:n2"
    assert address({"SLURM_JOB_ID": "77"}) is None and address({}) is None


def test_a_fork_of_the_standby_could_use_cuda_until_cuda_is_initialised(monkeypatch):
    """The check runs in a real child: here torch is imported and CUDA never initialised, so a
    fork is clean; torch marks a child forked after CUDA's initialisation "in bad fork" (and
    refuses it CUDA), which the check reads in the child, as the GPU's standby would."""
    import torch

    assert fork_is_clean()
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)  # as in a child of an initialised parent
    assert not fork_is_clean()


def test_a_standby_whose_fork_could_not_use_cuda_does_not_listen_and_the_ranks_start_cold(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", f"unit-{os.getpid()}")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setattr(standby, "warm_up", lambda: 0.0)  # the imports: this process has them
    monkeypatch.setattr(standby, "fork_is_clean", lambda: False)
    standby.serve()  # returns: nothing to serve
    assert "not listening: the imports initialised CUDA, which a forked rank could not use" in capsys.readouterr().out
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(address())  # what `standby run` tries first: refused, so it executes the rank itself
