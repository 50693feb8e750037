"""One home for a strategy (``train/contract/strategies.py``): every strategy/flag pair a rank
refuses before training is refused by the plan first, naming the same key, so that a job the
ranks would refuse never waits in a queue (issue 72)."""

import pytest

from cluster.plan import make_plan
from cluster.spec import JobSpec
from train.contract.config import Config, load
from train.contract.errors import ConfigError
from train.contract.strategies import STRATEGIES
from train.trainer.loop import checked_dims

FLAGS = [
    [],
    ["train.compile=true"],
    ["train.debug_collectives=true"],
    ["train.precision=fp16"],
    ["parallel.tp=2"],
    ["train.compile=true", "parallel.tp=2"],
]
DEVICES = {"cpu": ["gpus_per_node=0"], "cuda": ["gpus_per_node=2"]}


def refused_by(check) -> str | None:
    try:
        check()
    except ConfigError as exc:
        return exc.key
    return None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "+".join(f) or "none")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_plan_refuses_what_a_rank_would_naming_the_same_key(strategy, flags, device):
    tasks = 1 if STRATEGIES[strategy].one_process else 2
    keys = [f"parallel.strategy={strategy}", "train.batch_size=32", *flags]

    def rank():
        cfg = load(Config, None, keys)  # a rank reads its config, then checks before training
        checked_dims(cfg, device, tasks, tasks)

    def plan():
        make_plan(load(JobSpec, "jobs/local.yaml", [*keys, f"tasks_per_node={tasks}", *DEVICES[device]]))

    assert refused_by(plan) == refused_by(rank)


def test_the_table_refuses_the_pairs_the_issue_names():
    """``train.compile`` beside fsdp, fp16 on the CPU, and a tp of a strategy that has none."""
    assert refused_by(lambda: make_plan(load(JobSpec, "jobs/local.yaml", [
        "train.compile=true", "parallel.strategy=fsdp"]))) == "train.compile"  # fmt: skip
    assert (
        refused_by(lambda: make_plan(load(JobSpec, "jobs/local.yaml", ["train.precision=fp16"]))) == "train.precision"
    )
    assert refused_by(lambda: make_plan(load(JobSpec, "jobs/local.yaml", [
        "parallel.strategy=zero1", "parallel.tp=2"]))) == "parallel.tp"  # fmt: skip
