"""The one training loop. Strategies only wrap the model and optimizer (see ``parallel/``)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from train import checkpoint, faults
from train.config import Config, ConfigError, to_dict
from train.data import Dataset, ShardedSampler, dataset_bytes, make_dataset
from train.dist_env import DistEnv
from train.errors import NonFiniteLoss
from train.hangs import StallWatchdog
from train.loader import make_loader, placement
from train.model import build_mlp, parameter_count
from train.parallel.common import Context, Trainable, state_bytes
from train.parallel.mesh import resolve_dims
from train.parallel.registry import STRATEGIES
from train.preempt import armed
from train.protocol import CHECKPOINTS, RecordWriter, runtime_versions
from train.tensorboard import Board

NON_FINITE_HINT = "lower optim.lr, or set train.stop_on_nonfinite=false to train on"


def autocast_for(cfg: Config, device: torch.device, trainable: Trainable):
    return autocast_context(cfg.train.precision, device) if trainable.autocast else contextlib.nullcontext


# train.precision -> the dtype of the parameters, gradients, optimizer state and data set.
PARAM_DTYPE = {"bf16_params": torch.bfloat16}
# The strategies train.compile applies to: a module whose forward is the whole model on this
# rank (pipeline stages, sharded and hand-synchronised models are left eager).
COMPILABLE = ("single", "ddp")


def param_dtype(precision: str) -> torch.dtype:
    """The parameters' dtype: bf16 for bf16_params, else torch's default (float32; the
    equivalence tests' float64)."""
    return PARAM_DTYPE.get(precision, torch.get_default_dtype())


def autocast_context(precision: str, device: torch.device):
    """A factory of the autocast context of ``train.precision`` on ``device`` (none for fp32
    and for bf16 parameters, which need no casts)."""
    if precision in ("fp32", "bf16_params"):
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def check_supported(cfg: Config, device: torch.device) -> None:
    """Combinations that cannot work here: exit 2 on every rank, before training."""
    if cfg.train.precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision", "fp16 (with a GradScaler) needs CUDA; use bf16 on the CPU")
    if cfg.train.compile and (cfg.parallel.strategy not in COMPILABLE or (cfg.parallel.tp or 1) > 1):
        raise ConfigError(
            "train.compile",
            f"applies to parallel.strategy {' or '.join(COMPILABLE)} without tp, not {cfg.parallel.strategy}",
        )
    if cfg.train.debug_collectives and cfg.parallel.strategy == "ddp" and device.type == "cpu":
        raise ConfigError(
            "train.debug_collectives",
            "torch's DistributedDataParallel crashes (SIGSEGV while logging its construction) under "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo (measured with torch 2.13); debug with "
            "parallel.strategy=ddp_naive or ddp_bucketed (the same mathematics)",
        )


def setup(cfg: Config, env: DistEnv) -> tuple[Trainable, Context]:
    device = torch.device(env.device)
    check_supported(cfg, device)
    dims = resolve_dims(cfg.parallel, cfg.model, env.world_size, env.local_world_size)
    ctx = Context(cfg, env, device, dims, dims.build_mesh(device.type))
    torch.manual_seed(cfg.train.seed)
    model = build_mlp(cfg.model, cfg.train.seed, device).to(param_dtype(cfg.train.precision))
    trainable = STRATEGIES[cfg.parallel.strategy](model, ctx)
    if cfg.train.compile:  # the training forward only: evaluation stays eager (other shapes)
        trainable.model = torch.compile(trainable.model)
    return trainable, ctx


def training_data(cfg: Config, device: torch.device) -> tuple[Dataset, str]:
    """The data set, drawn on ``device`` and kept where ``data.placement`` says (and that place)."""
    dtype = param_dtype(cfg.train.precision)
    where = placement(cfg.data.placement, dataset_bytes(cfg.data, cfg.model, dtype), device)
    store = device if where == "device" else torch.device("cpu")
    return make_dataset(cfg.data, cfg.model, device, store, dtype), where


def check_replicas(trainable: Trainable, step: int) -> None:
    """train.check_sync: replicas must hold bitwise-equal parameters; name the odd one out."""
    group = trainable.replica_group
    if group is None:
        return
    params = {id(p): p for m in trainable.state_modules for p in m.parameters()}.values()
    device = next(iter(params)).device
    checksum = torch.zeros(2, dtype=torch.float64, device=device)
    for p in params:
        local = p.detach().to_local() if hasattr(p, "to_local") else p.detach()
        checksum[0] += local.double().sum()
        checksum[1] += local.double().square().sum()
    gathered = [torch.empty_like(checksum) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, checksum, group=group)
    values = [tuple(g.tolist()) for g in gathered]
    majority = max(set(values), key=values.count)
    diverged = [dist.get_global_rank(group, i) for i, v in enumerate(values) if v != majority]
    if diverged:
        raise RuntimeError(
            f"train.check_sync: parameters of rank(s) {diverged} diverged from their replicas at step {step}"
        )


class LossMeter:
    """Accumulates the loss on the device; reads it (one host sync) only at log intervals."""

    def __init__(self, device: torch.device, batch_size: int):
        self.batch_size = batch_size
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.steps = 0
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor | None) -> None:
        """One micro-step's loss (None on ranks that hold no loss, e.g. early pipeline stages)."""
        if loss is not None:
            self.loss_sum += loss
            self.loss_count += 1

    def step_done(self) -> None:
        self.steps += 1

    def flush(self, distributed: bool) -> dict:
        local = torch.stack([self.loss_sum.float(), torch.tensor(float(self.loss_count), device=self.loss_sum.device)])
        if distributed:  # the global mean over every rank that holds a loss
            both = local.clone()
            dist.all_reduce(both)
        else:
            both = local
        local_sum, local_n, global_sum, global_n = (*local.tolist(), *both.tolist())
        step_s = (time.perf_counter() - self.t0) / max(self.steps, 1)
        out = {
            "train_loss": global_sum / global_n if global_n else None,
            "local_loss": local_sum / local_n if local_n else None,
            "step_ms": step_s * 1e3,
            "samples_per_s": self.batch_size / step_s,
        }
        self.loss_sum.zero_()
        self.loss_count = self.steps = 0
        return out

    def restart_clock(self) -> None:
        """After evaluation and logging, so that their time is not counted as step time."""
        self.t0 = time.perf_counter()


def run(cfg: Config, env: DistEnv, quiet: bool = False) -> dict:
    """Train according to ``cfg`` on this rank; returns the last step record."""
    return train(cfg, env, *setup(cfg, env), quiet=quiet)


def train(cfg: Config, env: DistEnv, trainable: Trainable, ctx: Context, quiet: bool = False) -> dict:
    t = cfg.train
    coords = ctx.dims.coords(env.rank)
    data, where = training_data(cfg, ctx.device)
    sampler = ShardedSampler(
        len(data.x_train), t.batch_size, t.seed, coords["dp"], ctx.dims.dp, t.grad_accum, data.x_train.device
    )
    loader = make_loader(data, sampler, ctx.device, where)
    x_test, y_test = data.x_test.to(ctx.device), data.y_test.to(ctx.device)
    model, optimizer = trainable.model, trainable.optimizer
    autocast = autocast_for(cfg, ctx.device, trainable)
    scaler = torch.amp.GradScaler("cuda") if t.precision == "fp16" else None
    scale = 1.0 / t.grad_accum
    say = print if trainable.reports and not quiet else (lambda *a, **k: None)

    def forward_backward(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        with autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        scaled = loss * scale if scale != 1.0 else loss
        (scaler.scale(scaled) if scaler else scaled).backward()
        return loss.detach()

    fb = trainable.forward_backward or forward_backward
    writer = RecordWriter(t.run_dir, env.rank)
    writer.write(
        "start", env=env.as_record(), pid=os.getpid(), coords=coords, dims=asdict(ctx.dims), config=to_dict(cfg),
        versions=runtime_versions(),
    )  # fmt: skip
    if not quiet:  # every rank, so that each rank's log says who and where it is
        print(
            f"rank {env.rank}/{env.world_size} on {env.host} (node {env.node_rank}, local rank {env.local_rank}), "
            f"device {ctx.device}, pid {os.getpid()}, mesh {coords}",
            flush=True,
        )
    say(
        f"strategy {cfg.parallel.strategy} | world {env.world_size} ({env.launcher}) | dims {asdict(ctx.dims)} | "
        f"device {ctx.device} | {parameter_count(cfg.model):,} parameters"
    )
    board = Board(t.run_dir, t.tensorboard and env.rank == 0 and not quiet, say)
    ckpt_dir = Path(t.run_dir) / CHECKPOINTS
    start = 0
    # A checkpoint here is this run's own: written at its intervals or at the time-limit signal.
    if (resume := checkpoint.latest(ckpt_dir)) is not None:
        saved_world = checkpoint.saved_world_size(resume)
        if saved_world != env.world_size:
            say(f"resharding a {saved_world}-rank checkpoint to {env.world_size} ranks")
        start = checkpoint.load(resume, trainable, scaler, ctx.dims.tp)
        say(f"resumed from {resume} (step {start})")
        writer.write("resume", step=start, path=str(resume), from_world_size=saved_world)
    layout = asdict(ctx.dims)  # kept in checkpoints: a resume on another layout checks against it
    preempt = armed(t.preempt_signal)  # armed already by python -m train: what came in start-up counts
    progress = LossMeter(ctx.device, t.batch_size)
    record: dict = {}
    finite: tuple[int, float] | None = None  # the last logged step with a finite loss
    memory = None
    if t.startup_timeout_s and not quiet:
        print(
            f"start-up limit: stacks to this log and exit 1 without a first step {t.startup_timeout_s:g} s after the start",
            flush=True,
        )
    if t.stall_timeout_s and not quiet:
        print(f"stall watchdog: stacks to this log and exit 1 after {t.stall_timeout_s:g} s without a step", flush=True)
    watchdog = StallWatchdog(t.stall_timeout_s)  # from the first step: until then, the start-up limit
    step = start
    batches = loader.batches(start, t.steps)

    def save(step: int) -> None:
        """A checkpoint of a finite state only: ``latest`` never points at nan or inf."""
        if not state_is_finite(progress, trainable, env.distributed):
            last = checkpoint.latest(ckpt_dir)
            message = (
                f"the state at step {step} is non-finite (a nan or inf loss or parameter): not saved; "
                f"the latest checkpoint stays {last.name if last else 'none'}"
            )
            if t.stop_on_nonfinite:
                raise NonFiniteLoss(f"{message}; {NON_FINITE_HINT}")
            say(message)
            return
        started = time.perf_counter()
        checkpoint.save(ckpt_dir, step, trainable, scaler, layout)
        writer.write("checkpoint", step=step, seconds=round(time.perf_counter() - started, 3))  # goodput's

    try:
        for step in range(start + 1, t.steps + 1):
            with steady_state(ctx.device, t.sync_debug and step > start + 1):
                faults.inject(t, step, env.rank, ctx.device, env.restart)
                for micro in range(t.grad_accum):
                    x, y = next(batches)
                    inner = micro < t.grad_accum - 1
                    with trainable.no_sync() if inner else contextlib.nullcontext():
                        progress.add(fb(x, y, scale))
                trainable.finish_grads()
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                trainable.after_step(step)
            if memory is None:  # gradients and optimizer state all exist now
                memory = state_bytes(trainable)
            optimizer.zero_grad(set_to_none=True)
            progress.step_done()
            if step == start + 1:  # when this attempt began to train (cluster logs: time to recover)
                watchdog.start()
                writer.write("first_step", step=step)
            else:
                watchdog.progress()
            last = step == t.steps
            if t.ckpt_every and (step % t.ckpt_every == 0 or last):
                save(step)
            if step % t.log_every and step % t.eval_every and not last:
                continue
            record = {"step": step, **progress.flush(env.distributed), "test_loss": None, "test_acc": None}
            if step % t.eval_every == 0 or last:
                if t.check_sync and trainable.synced(step):
                    check_replicas(trainable, step)
                result = trainable.evaluate(x_test, y_test)
                if result is not None:
                    record["test_loss"], record["test_acc"] = result
            if last:
                record["final"] = True
                record["state_bytes"] = memory
            writer.write("step", **record)
            board.step(record)
            say(format_line(record, t.steps))
            if t.stop_on_nonfinite:
                finite = check_finite(record, env.rank, finite)
            if not last and on_any_rank(preempt.raised, env.distributed, ctx.device):
                if not t.ckpt_every or step % t.ckpt_every:
                    save(step)
                record["preempted"] = True
                writer.write("preempted", step=step)
                say(f"preemption signal ({preempt.signal.name}): checkpoint saved at step {step}")
                break
            progress.restart_clock()
        if start >= t.steps:  # resumed from the final checkpoint: nothing left but to report it
            record = {"step": start, "train_loss": None, "local_loss": None, "step_ms": 0.0, "samples_per_s": 0.0}
            record["test_loss"], record["test_acc"] = trainable.evaluate(x_test, y_test) or (None, None)
            record.update(final=True, state_bytes=state_bytes(trainable))
            writer.write("step", **record)
            say(f"already complete at step {start}")
    except Exception as exc:  # the rank protocol's failed record: the step this rank raised at
        writer.write("failed", step=step, error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        watchdog.stop()
        loader.close()
        writer.close()
        board.close()
    return record


@contextlib.contextmanager
def steady_state(device: torch.device, debug: bool):
    """train.sync_debug: any host-device synchronisation in this block raises (CUDA only)."""
    if not debug or device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def state_is_finite(progress: LossMeter, trainable: Trainable, distributed: bool) -> bool:
    """Whether every rank's losses since the last log step and its parameters are finite: the
    loss sum accumulated on the device turns nan or inf with any non-finite step, so this costs
    nothing per step and one small all_reduce per save (every rank saves, or none does)."""
    ok = torch.isfinite(progress.loss_sum).all()
    for module in trainable.state_modules:
        for p in module.parameters():
            local = p.detach().to_local() if hasattr(p, "to_local") else p.detach()
            ok = ok & torch.isfinite(local).all()
    flag = ok.float().reshape(1)
    if distributed:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def on_any_rank(flag: bool, distributed: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any (a rank that got the signal late still
    stops with the others)."""
    if not distributed:
        return flag
    agreed = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


def check_finite(record: dict, rank: int, finite: tuple[int, float] | None) -> tuple[int, float] | None:
    """Raise once the (global) training loss is nan or inf; else the new last finite (step, loss).
    Every rank sees the same global loss, so all stop at the same step; the ranks whose own
    loss is non-finite say so, the others say they stop with them (a cascade)."""
    loss, mine, step = record["train_loss"], record["local_loss"], record["step"]
    if loss is None or math.isfinite(loss):
        return (step, loss) if loss is not None else finite
    before = f"last finite loss {finite[1]:.6g} at step {finite[0]}" if finite else "no finite loss logged before"
    if mine is not None and not math.isfinite(mine):
        raise NonFiniteLoss(f"training loss is {mine} at step {step} on rank {rank} ({before}); {NON_FINITE_HINT}")
    raise NonFiniteLoss(f"stopping at step {step}: the loss is non-finite on another rank ({before})")


def format_line(r: dict, steps: int) -> str:
    def num(key: str, fmt: str) -> str:
        return "-" if r.get(key) is None else format(r[key], fmt)

    return (
        f"step {r['step']:>{len(str(steps))}}/{steps}  train_loss {num('train_loss', '.4f')}  "
        f"test_loss {num('test_loss', '.4f')}  test_acc {num('test_acc', '.4f')}  "
        f"{r['step_ms']:.2f} ms/step  {r['samples_per_s']:,.0f} samples/s"
    )
