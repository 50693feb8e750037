"""What a SLURM partition can ever give (``cluster.backends.slurm.limits``): scontrol's lines
read, and each request beyond them named with its spec key and the limit. Table-tested on
the minicluster's own lines (3 nodes x 4 CPUs, 8000 MB, 4 GPUs) and a mixed partition."""

import pytest

from cluster.backends.slurm.limits import Ask, Node, Partition, beyond, gpus, mem_mb, minutes, parse, partition_of

PARTITION = ("PartitionName=debug AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n[1-3] "
             "State=UP TotalCPUs=12 TotalNodes=3")  # fmt: skip
NODE = ("NodeName=n{i} Arch=x86_64 CPUAlloc=0 CPUEfctv=4 CPUTot=4 Gres=gpu:4 NodeAddr=127.0.0.1 "
        "OS=Linux 6.18 #1 SMP RealMemory=8000 AllocMem=0 State=IDLE Partitions=debug  BootTime=None")  # fmt: skip
MINI = parse(PARTITION, [NODE.format(i=i) for i in (1, 2, 3)] + ["NodeName=x9 CPUTot=64 Partitions=other"])
MIXED = Partition("mixed", (Node("a", 64, 512000, 8), Node("b", 16, 64000, 0), Node("c", 16, 64000, 0)), 2, 60)


def test_scontrols_lines_are_read():
    assert MINI == Partition("debug", tuple(Node(f"n{i}", 4, 8000, 4) for i in (1, 2, 3)), None, None)


@pytest.mark.parametrize(("text", "expected"), [("UNLIMITED", None), ("INFINITE", None), ("30", 30), ("1:30", 1.5),
                         ("2:00:00", 120), ("1-0", 1440), ("1-2:30", 1590), ("1-0:0:30", 1440.5)])  # fmt: skip
def test_max_time_in_slurms_formats(text, expected):
    assert minutes(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("8000", 8000), ("8000M", 8000), ("128G", 131072), ("1T", 1048576)])
def test_mem_in_slurms_units(text, expected):
    assert mem_mb(text) == expected


def test_gres_gpus():
    assert (gpus("gpu:4"), gpus("gpu:a100:8(S:0-1),gpu:2"), gpus("(null)"), gpus("shard:8")) == (4, 10, 0, 0)
    assert gpus("gpu:a100:4(S:0,2),shard:8") == 4  # a socket list holds a comma


def test_a_partition_whose_nodes_are_not_all_seen_is_not_judged():
    """PrivateData=nodes, powered-down cloud nodes, a SLURM without Partitions=: fewer node
    lines than TotalNodes, or none, and nothing is refused."""
    assert parse(PARTITION, [NODE.format(i=1)]) is None and parse(PARTITION, []) is None


def test_the_partition_sbatch_will_use(monkeypatch):
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    assert partition_of("", ()) == "" and partition_of("gpu", ("--partition=cpu",)) == "gpu"
    assert partition_of("", ("--qos=x", "--partition=big")) == "big" and partition_of("", ("-pbig",)) == "big"
    monkeypatch.setenv("SBATCH_PARTITION", "env")
    assert partition_of("", ()) == "env"


@pytest.mark.parametrize(
    ("ask", "part", "said"),
    [
        (Ask(2, 4, 8000, 4, 600), MINI, []),
        (Ask(4, 1, None, 0, 10), MINI, ["nodes + spare_nodes = 4 > 3 nodes in partition debug"]),
        (Ask(1, 32, None, 0, 10), MINI, ["cpus_per_task × tasks_per_node = 32 > 4 CPUs on every node of partition debug"]),
        (Ask(1, 1, 131072, 8, 10), MINI, ["gpus_per_node = 8 > 4 GPUs on every node of partition debug",
                                          "mem = 131072M > 8000M of memory on every node of partition debug"]),
        # one node has the GPUs, two are asked: the count of nodes that fit is what fails
        (Ask(2, 8, None, 8, 10), MIXED, ["nodes + spare_nodes = 2 > 1 nodes in partition mixed that have what each "
                                         "node asks"]),
        (Ask(3, 1, None, 0, 90), MIXED, ["nodes + spare_nodes = 3 > MaxNodes=2 of partition mixed",
                                         "time = 90 min > MaxTime=60 min of partition mixed"]),
    ],
)  # fmt: skip
def test_each_request_beyond_the_partition_is_named_with_its_key_and_limit(ask, part, said):
    assert beyond(ask, part) == said
