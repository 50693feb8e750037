"""What a node's standby (``train.rank.standby``) starts warm, and where it listens. (A real standby
forking real ranks: tests/processes/test_standby.py; in a job: the SLURM tier's restarts.)"""

import sys

import pytest

from train.rank.standby import address, warm_command


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
