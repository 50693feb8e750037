"""The kit from Python: one job, then a sweep, each waited for and triaged, then a Python
function run on every rank, its result printed.

python jobs/from_python.py            # on this machine (cluster=local), about a minute
python jobs/from_python.py slurm      # the same on a SLURM cluster (jobs/multi_node.yaml)
"""

import sys

import cluster

SPEC = "jobs/multi_node.yaml" if sys.argv[1:] == ["slurm"] else "jobs/local.yaml"
SMALL = {"train.steps": 40, "train.eval_every": 20, "tasks_per_node": 2, "train.batch_size": 64}

job = cluster.submit(SPEC, **SMALL)
print(f"job {job.job_id}: {job.state().name}; logs in {job.job_dir}")
report = job.wait(timeout=1800)
print(f"{report.completed}/{report.world_size} ranks completed; first failure: {report.first_failure}")

sweep = cluster.sweep(
    SPEC, grid={"optim.lr": [0.05, 0.1], "parallel.strategy": ["ddp", "zero1"]}, max_parallel=2, **SMALL
)
table = sweep.wait(timeout=3600)
for row in table["points"]:
    print(row["point"], " ".join(row["overrides"]), row["state"], row["metrics"].get("test_loss"))
print("best:", table["best"])


def ranks_sum(scale):
    """Defined here, in __main__: it travels by value (cloudpickle, as submitit sends it)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([scale * dist.get_rank()])
    dist.all_reduce(total)
    return total.item()


job = cluster.submit(ranks_sum, 10.0, spec=SPEC, overrides={"tasks_per_node": 2})
print(f"function job {job.job_id}: rank 0 returned {job.result(timeout=600)}")
