"""Runs on every rank under torchrun for the equivalence tests.

``python -m tests.support.dist_worker OUT_DIR [--probe-grads] [--probe-divergence] [--probe-replicas] [--probe-init] [--float64] key=value ... [--then OUT_DIR ...]``:
trains with the kit's own setup and loop, then saves this rank's full parameters to
``OUT_DIR/params_<rank>.pt`` (and probe results to ``OUT_DIR/probe_<rank>.pt``). Each
``--then`` starts another run, trained from scratch (or resumed from its folder's checkpoint)
after the one before, in the same processes and process group: torchrun's and the ranks'
start-up, most of a small run's time on 2 cores, is paid once for them all.
"""

import copy
import hashlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from train.contract.config import Config, load
from train.contract.strategies import needs_process_group
from train.rank.dist_env import from_environ, init_process_group
from train.rank.output import leave
from train.trainer.data import ShardedSampler, make_dataset
from train.trainer.loop import check_replicas, param_dtype, setup, train, training_data
from train.trainer.model import build_mlp
from train.trainer.parallel.common import full_parameters


def probe_grads(cfg, env, trainable, ctx) -> dict:
    """Synchronised gradients vs the mean of every rank's local gradients on its own shard."""
    coords = ctx.dims.coords(env.rank)
    data = make_dataset(cfg.data, cfg.model)
    idx = ShardedSampler(len(data.x_train), cfg.train.batch_size, cfg.train.seed, coords["dp"], ctx.dims.dp).indices(0)
    x, y = data.x_train[idx], data.y_train[idx]
    reference = copy.deepcopy(trainable.state_modules[0])
    local_loss = torch.nn.functional.cross_entropy(reference(x), y)
    local_loss.backward()
    local = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    mean = local.clone()
    dist.all_reduce(mean)
    mean /= env.world_size
    torch.nn.functional.cross_entropy(trainable.model(x), y).backward()
    trainable.finish_grads()
    synced = torch.cat([p.grad.reshape(-1) for p in trainable.state_modules[0].parameters()])
    trainable.optimizer.zero_grad(set_to_none=True)
    return {"local": local, "mean": mean, "synced": synced, "local_loss": local_loss.item()}


def probe_replicas(trainable, probe: dict) -> None:
    """After every step (and its averaging, if any): a hash of this rank's parameters' bytes,
    so that the test can tell bitwise-equal replicas from drifting ones step by step."""
    hashes = probe.setdefault("replica_hashes", [])
    after_step = trainable.after_step

    def hashed(step: int) -> None:
        after_step(step)
        flat = torch.cat([p.detach().reshape(-1) for p in trainable.state_modules[0].parameters()])
        hashes.append((step, hashlib.sha256(flat.numpy().tobytes()).hexdigest()))

    trainable.after_step = hashed


def probe_init(cfg, env) -> dict:
    """sha256 of the model's initial weights and of the data set as this rank builds them, on its
    device, before any strategy (DDP would broadcast rank 0's weights and hide a difference)."""
    model = build_mlp(cfg.model, cfg.train.seed, env.device).to(param_dtype(cfg.train.precision))
    data, _ = training_data(cfg, torch.device(env.device))

    def digest(tensors) -> str:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    return {"weights_sha256": digest(model.parameters()), "data_sha256": digest(vars(data).values())}


THEN = "--then"


def runs(argv: list[str]) -> list[tuple[Path, list[str], Config]]:
    """Each run's (folder, flags, config), from the command line's groups between ``--then``."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg == THEN:
            groups.append([])
        else:
            groups[-1].append(arg)
    return [
        (
            Path(out),
            [a for a in rest if a.startswith("--")],
            load(Config, None, [a for a in rest if not a.startswith("--")]),
        )
        for out, *rest in groups
    ]


def run_one(out: Path, flags: list[str], cfg: Config, env) -> None:
    # model and data in float64: rounding 1e-16, far below any mathematical difference
    torch.set_default_dtype(torch.float64 if "--float64" in flags else torch.float32)
    probe = probe_init(cfg, env) if "--probe-init" in flags else {}
    trainable, ctx = setup(cfg, env)
    if "--probe-grads" in flags:
        probe.update(probe_grads(cfg, env, trainable, ctx))
    if "--probe-replicas" in flags:
        probe_replicas(trainable, probe)
    train(cfg, env, trainable, ctx, quiet=True)
    if "--probe-replicas" in flags:
        from train.trainer.parallel.param_avg import optimizer_state_tensors

        state = optimizer_state_tensors(trainable.optimizer)  # none for plain SGD
        probe["optimizer_state"] = torch.cat([t.reshape(-1) for t in state] or [torch.zeros(0)])
    if "--probe-divergence" in flags:
        if env.rank == env.world_size - 1:
            with torch.no_grad():
                next(trainable.state_modules[0].parameters()).add_(1e-3)
        try:
            check_replicas(trainable, step=-1)
            probe["divergence_error"] = None
        except RuntimeError as exc:
            probe["divergence_error"] = str(exc)
    params = full_parameters(trainable)
    torch.save(params, out / f"params_{env.rank}.pt")
    torch.save(probe, out / f"probe_{env.rank}.pt")


def main() -> None:
    todo = runs(sys.argv[1:])
    env = from_environ(device=todo[0][2].train.device)
    if any(needs_process_group(cfg.parallel.strategy, env.world_size) for _, _, cfg in todo):
        init_process_group(env, todo[0][2].train.timeout_s)
    try:
        for out, flags, cfg in todo:
            run_one(out, flags, cfg, env)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave(0)  # as the kit's ranks do: no interpreter finalization (gloo can abort there)
