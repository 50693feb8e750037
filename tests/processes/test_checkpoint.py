import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import torchrun
from tests.support.checkpoint import BASE, params_after
from tests.support.strategies import ATOL, max_diff, run_strategies, run_strategy
from train.contract.protocol import read_records, record_name

# 4-rank DDP: bucket layout must not change at resume (ddp.settle_buckets); pipeline: stages'
# optimizer groups must not be deduplicated (checkpoint._options): either breaks resume.
# zero1: each rank's momentum shard is saved beside DCP's files.
RESUMED = {4: ["ddp", "pipeline"], 2: ["fsdp", "tp", "zero1"]}
# and saved asynchronously (train.ckpt_async), every strategy of more than one process: param_avg's
# own parameters and ddp_bucketed's buckets too (single and model_parallel: the unit tier)
ASYNC = {4: ["ddp", "pipeline"], 2: ["fsdp", "tp", "zero1", "param_avg", "ddp_bucketed", "ddp_naive"]}


def straight_and_resumed(
    root: Path, nprocs: int, strategies: list[str], *extra: str
) -> dict[str, tuple[list, list, list]]:
    """Per strategy: every rank's parameters after 40 steps straight and after 20 steps, then
    20 more resumed in fresh processes, and the resumed run's records. Two torchruns for all
    the strategies: the straight runs and the first halves, then the second halves."""
    args = {s: [f"parallel.strategy={s}", *BASE, *extra] for s in strategies}
    first = {root / s / "a": [*args[s], "train.steps=40"] for s in strategies}
    first |= {root / s / "b": [*args[s], "train.steps=20"] for s in strategies}
    straight = run_strategies(nprocs, first)
    resumed = run_strategies(nprocs, {root / s / "b": [*args[s], "train.steps=40"] for s in strategies})
    return {s: (straight[root / s / "a"][0], *resumed[root / s / "b"][0::2]) for s in strategies}


@pytest.fixture(scope="module")
def resumes(tmp_path_factory):
    """straight_and_resumed of every strategy of RESUMED, per rank count and way of saving
    (train.ckpt_async) when first asked."""
    done: dict[tuple[int, bool], dict] = {}

    def of(strategy: str, nprocs: int, asynchronous: bool = False) -> tuple[list, list, list]:
        key = (nprocs, asynchronous)
        if key not in done:
            extra = ["train.ckpt_async=true"] if asynchronous else []
            root = tmp_path_factory.mktemp(f"x{nprocs}{'async' if asynchronous else ''}")
            done[key] = straight_and_resumed(root, nprocs, (ASYNC if asynchronous else RESUMED)[nprocs], *extra)
        return done[key][strategy]

    return of


def assert_resumed_bitwise(straight: list[dict], resumed: list[dict], records: list[list[dict]]) -> None:
    for rank, params in enumerate(straight):  # pipeline stages each hold their own layers
        assert max_diff(params, resumed[rank]) == 0.0
    assert any(r["event"] == "resume" and r["step"] == 20 for r in records[0])


@pytest.mark.slow
@pytest.mark.parametrize("strategy, nprocs", [(s, n) for n, strategies in RESUMED.items() for s in strategies])
def test_distributed_resume_is_bitwise_identical(strategy, nprocs, resumes):
    assert_resumed_bitwise(*resumes(strategy, nprocs))


@pytest.mark.slow
@pytest.mark.parametrize("strategy, nprocs", [(s, n) for n, strategies in ASYNC.items() for s in strategies])
def test_a_resume_from_asynchronous_checkpoints_is_bitwise_identical(strategy, nprocs, resumes):
    """train.ckpt_async: every strategy's state staged, written by DCP's own process, published
    once every rank wrote; the resumed run ends bitwise where the straight one did."""
    straight, resumed, records = resumes(strategy, nprocs, asynchronous=True)
    assert_resumed_bitwise(straight, resumed, records)
    saves = [r for r in records[0] if r["event"] == "checkpoint"]
    assert saves and all(r["asynchronous"] for r in saves) and saves[-1]["final"]
    assert {r["step"] for r in records[0] if r["event"] == "checkpoint_written"} == {10, 20, 30, 40}  # both halves


# Resharding: train on one layout, resume on others. batch 48 splits over 1, 2, 3 and 4 ranks;
# the global batch of each step is the same set on any number of ranks, so the mathematics is
# one process's and the tolerance is the data-parallel tests' ATOL.
RESHARD = [*BASE, "train.batch_size=48"]


def train_steps(run_dir, strategy: str, nprocs: int, steps: int) -> tuple[dict, list[dict]]:
    """The full parameters and rank 0's records after training to ``steps`` in ``run_dir``."""
    args = [f"parallel.strategy={strategy}", *RESHARD, f"train.steps={steps}"]
    out = run_dir / "dist"  # where run_strategy's ranks write
    if nprocs == 1:
        out.mkdir(parents=True, exist_ok=True)
        params = params_after(out, steps, *args)
        return params, read_records(out / record_name(0))
    params, _, records = run_strategy(run_dir, nprocs, *args)
    # Every layer, from whichever rank holds it (pipeline stages), rank 0's copy first.
    return {k: v for rank in reversed(params) for k, v in rank.items()}, records[0]


@pytest.fixture(scope="module")
def unresharded(tmp_path_factory):
    return params_after(tmp_path_factory.mktemp("straight"), 40, *RESHARD)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layouts",
    # Each layout trains 10 more steps from the previous one's checkpoint: down, up, between
    # strategies, to and from one process, to and from tensor-parallel and pipeline layouts.
    [[("ddp", 4), ("ddp", 3), ("single", 1), ("fsdp", 4)],
     [("tp", 4), ("tp", 2), ("fsdp", 4), ("pipeline", 2)]],
    ids=["ddp-4-3-single-fsdp-4", "tp-4-2-fsdp-4-pipeline-2"],
)  # fmt: skip
def test_resume_on_another_layout_reshards(layouts, tmp_path, unresharded):
    run = tmp_path / "run"
    for i, (strategy, nprocs) in enumerate(layouts):
        params, records = train_steps(run, strategy, nprocs, 10 * (i + 1))
    diff = max_diff(params, unresharded)
    print(f"{' -> '.join(f'{s} x{n}' for s, n in layouts)}: max |param - uninterrupted single| = {diff:.3g}")
    assert diff < ATOL
    resumes = [(r["step"], r["from_world_size"]) for r in records if r["event"] == "resume"]
    assert resumes[-1] == (30, layouts[2][1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """zero1's and tp's run folders (``saved / strategy``), 2 ranks trained to step 10 in one
    torchrun: what the refusals below are asked to resume from."""
    root = tmp_path_factory.mktemp("saved")
    run_strategies(2, {root / s: [f"parallel.strategy={s}", *RESHARD, "train.steps=10"] for s in ("zero1", "tp")})
    return root


@pytest.mark.slow
def test_per_rank_optimizer_state_is_refused_on_another_rank_count_naming_what_to_do(saved):
    out = saved / "zero1"
    result = torchrun(3, "train", "parallel.strategy=zero1", *RESHARD, "train.steps=20", f"train.run_dir={out}")
    # The ranks exit 2 with the message (a bad input, like a bad key), none with a traceback
    # (torchrun ends the others once the first has exited).
    assert "cannot be resharded to 3: resume on 2 ranks" in result.stderr, result.stderr[-3000:]
    assert "exitcode  : 2" in result.stderr and "failed on" not in result.stderr


@pytest.mark.slow
def test_a_larger_tensor_dimension_than_saved_is_refused(saved):
    """tp=2 -> tp=4 loads the state bitwise and then drifts (train.trainer.checkpoint.load)."""
    out = saved / "tp"
    result = torchrun(4, "train", "parallel.strategy=tp", *RESHARD, "train.steps=20", f"train.run_dir={out}")
    assert "saved with tensor parallelism tp=2; resuming at tp=4" in result.stderr, result.stderr[-3000:]
    assert "exitcode  : 2" in result.stderr and "failed on" not in result.stderr


@pytest.mark.slow
def test_fsdp_resume_under_load_exits_cleanly_every_time(tmp_path):
    """The stress variant: with a core kept busy, a rank of this test once aborted at exit in
    1 of 4 runs ("terminate called without an active exception", in interpreter
    finalization after its work was done). Ranks now leave without finalization. One round of
    three runs in two launches here; `make test` beside `yes` repeats it all."""
    busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
    try:
        assert_resumed_bitwise(*straight_and_resumed(tmp_path, 2, ["fsdp"])["fsdp"])
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.slow
def test_an_asynchronous_save_that_cannot_be_written_is_named_and_the_run_goes_on(tmp_path):
    """Step 40's save cannot be written (its directory is a file, as on a full disk): the run
    trains on to its end, `cluster logs` names the save and why, the checkpoint before it
    (step 20) stayed latest until step 60's was written."""
    from tests.support.jobs import logs_json, submit

    result, info = submit("jobs/local.yaml", tmp_path, "tasks_per_node=2", "train.steps=60", "train.log_every=20",
                          "train.ckpt_every=20", "train.ckpt_async=true", "train.unwritable_ckpt_at_step=40")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    job = Path(info["log_dir"])
    records = list(read_records(job / record_name(0)))
    assert [(r["event"], r["step"]) for r in records if r["event"].startswith("checkpoint_")] == [
        ("checkpoint_written", 20), ("checkpoint_failed", 40), ("checkpoint_written", 60)]  # fmt: skip
    failed = next(r for r in records if r["event"] == "checkpoint_failed")
    assert "step_0000040.tmp" in failed["error"] and "\n" not in failed["error"]
    assert (job / "checkpoints" / "latest").read_text().strip() == "step_0000060"
    assert (
        not (job / "checkpoints" / "step_0000040").exists() and not (job / "checkpoints" / "step_0000040.tmp").exists()
    )
    _, report = logs_json(job)
    assert report["completed"] == 2 and all(r["checkpoint_error"].startswith("step 40: ") for r in report["ranks"])
    text = subprocess.run([sys.executable, "-m", "cluster", "logs", str(job)], capture_output=True, text=True).stdout
    assert "CHECKPOINT NOT WRITTEN on ranks 0-1, step 40: " in text
