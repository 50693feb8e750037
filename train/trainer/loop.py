"""The one training loop. Strategies only wrap the model and optimizer (see ``parallel/``)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from train.contract.config import Config, to_dict
from train.contract.errors import ConfigError, NonFiniteLoss
from train.contract.mesh import ParallelDims, resolve_dims
from train.contract.protocol import RecordWriter, runtime_versions
from train.contract.strategies import apply_function, check_flags
from train.rank.dist_env import DistEnv
from train.rank.hangs import StallWatchdog
from train.trainer import checkpoint, faults
from train.trainer.data import Dataset, ShardedSampler, dataset_bytes, make_dataset
from train.trainer.loader import make_loader, placement
from train.trainer.model import build_mlp, parameter_count
from train.trainer.parallel.common import Context, Trainable, state_bytes
from train.trainer.preempt import armed
from train.trainer.tensorboard import Board

NON_FINITE_HINT = "lower optim.lr, or set train.stop_on_nonfinite=false to train on"


def autocast_for(cfg: Config, device: torch.device, trainable: Trainable):
    return autocast_context(cfg.train.precision, device) if trainable.autocast else contextlib.nullcontext


# train.precision -> the dtype of the parameters, gradients, optimizer state and data set.
PARAM_DTYPE = {"bf16_params": torch.bfloat16}


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


def checked_dims(cfg: Config, device_type: str, world_size: int, ranks_per_node: int) -> ParallelDims:
    """What this rank refuses before training (exit 2 on every rank, naming the key): the
    trainer's flags against the strategy and the device, and the layout; else its dimensions.
    The plan refuses the same first (tests/unit/test_strategies.py)."""
    check_flags(cfg.train, cfg.parallel, device_type)
    return resolve_dims(cfg.parallel, cfg.model, world_size, ranks_per_node)


def setup(cfg: Config, env: DistEnv) -> tuple[Trainable, Context]:
    device = torch.device(env.device)
    dims = checked_dims(cfg, device.type, env.world_size, env.local_world_size)
    ctx = Context(cfg, env, device, dims, dims.build_mesh(device.type))
    torch.manual_seed(cfg.train.seed)
    model = build_mlp(cfg.model, cfg.train.seed, device).to(param_dtype(cfg.train.precision))
    trainable = apply_function(cfg.parallel.strategy)(model, ctx)
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


@dataclass
class Outlets:
    """Where this rank's run reports: its records, its TensorBoard events, its log's lines
    (``say``: rank 0's, where the strategy reports)."""

    writer: RecordWriter
    board: Board
    say: Callable[..., None]


@dataclass
class LoopState:
    """The loop's state as one typed object (torchtitan's trainer holds its own): what the
    loop's named parts read and change, instead of bags of positional parameters."""

    ctx: Context  # the config, this rank, its device and parallel dimensions
    trainable: Trainable
    out: Outlets
    schedule: Schedule
    meter: LossMeter
    ckpt: Checkpointer
    data: Data
    memory: int | None = None  # gradients' and optimizer state's bytes, once they all exist


def run(cfg: Config, env: DistEnv, quiet: bool = False) -> dict:
    """Train according to ``cfg`` on this rank; returns the last step record."""
    return train(cfg, env, *setup(cfg, env), quiet=quiet)


def train(cfg: Config, env: DistEnv, trainable: Trainable, ctx: Context, quiet: bool = False) -> dict:
    """The loop, top to bottom: set up, resume, then each step: train, then the decisions of
    ``Schedule`` (save, log, evaluate, stop at the time-limit signal), each a named part."""
    t = cfg.train
    say = print if trainable.reports and not quiet else (lambda *a, **k: None)
    writer = RecordWriter(t.run_dir, env.rank)
    announce(cfg, env, ctx, writer, say, quiet)
    out = Outlets(writer, Board(t.run_dir, t.tensorboard and env.rank == 0 and not quiet, say), say)
    scaler = torch.amp.GradScaler("cuda") if t.precision == "fp16" else None
    ckpt = Checkpointer(ctx, trainable, scaler, out)
    start = ckpt.resume(env.world_size, ctx.dims.tp)
    data, loader, batches = training_batches(cfg, ctx, start)
    one_step = optimizer_step(cfg, ctx, trainable, scaler)
    s = LoopState(ctx, trainable, out, Schedule.of(t), LossMeter(ctx.device, t.batch_size), ckpt, data)
    preempt = armed(t.preempt_signal)  # armed already by python -m train
    watchdog = StallWatchdog(t.stall_timeout_s)  # from the first step: until then, the start-up limit
    record: dict = {}
    finite: tuple[int, float] | None = None  # the last logged step with a finite loss
    step = start
    try:
        for step in range(start + 1, t.steps + 1):
            with steady_state(ctx.device, t.sync_debug and step > start + 1):
                faults.inject(t, step, env.rank, ctx.device, env.restart)
                one_step(s.meter, batches)
                trainable.after_step(step)  # the strategy's own, after the optimizer (param_avg averages)
            s.memory = s.memory or state_bytes(trainable)  # gradients and optimizer state all exist now
            trainable.optimizer.zero_grad(set_to_none=True)
            s.meter.step_done()
            stepped(watchdog, writer, step, start)
            if s.schedule.saves(step):
                ckpt.save(step, s.meter, env.distributed, final=s.schedule.is_last(step))
            if not s.schedule.logs(step):
                continue
            record = log_step(s, step)
            finite = check_finite(record, env.rank, finite) if t.stop_on_nonfinite else finite
            if not s.schedule.is_last(step) and on_any_rank(preempt.raised, env.distributed, ctx.device):
                record = stop_at_signal(s, step, preempt.signal, record)
                break
            s.meter.restart_clock()
        if start >= t.steps:  # resumed from the final checkpoint: nothing left but to report it
            record = already_complete(start, trainable, data, writer, say)
    except Exception as exc:  # the rank protocol's failed record: the step this rank raised at
        writer.write("failed", step=step, error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        watchdog.stop()
        ckpt.close()
        loader.close()
        writer.close()
        out.board.close()
    return record


@dataclass(frozen=True)
class Schedule:
    """When the loop saves, logs, evaluates: each decision alone (torchtitan keeps its save
    policy in ``CheckpointManager._should_save`` the same way)."""

    steps: int
    log_every: int
    eval_every: int
    ckpt_every: int

    @classmethod
    def of(cls, t) -> Schedule:
        return cls(t.steps, t.log_every, t.eval_every, t.ckpt_every)

    def is_last(self, step: int) -> bool:
        return step == self.steps

    def saves(self, step: int) -> bool:
        """At every ``ckpt_every`` steps and at the end (none without ``ckpt_every``)."""
        return bool(self.ckpt_every) and (step % self.ckpt_every == 0 or self.is_last(step))

    def evaluates(self, step: int) -> bool:
        return step % self.eval_every == 0 or self.is_last(step)

    def logs(self, step: int) -> bool:
        """A step record (and the line of the log) at log and evaluation steps, and the last."""
        return step % self.log_every == 0 or self.evaluates(step)

    def saves_at_signal(self, step: int) -> bool:
        """At the time-limit signal: a save, unless this step's has just been made."""
        return not (self.ckpt_every and step % self.ckpt_every == 0)


def announce(cfg: Config, env: DistEnv, ctx: Context, writer: RecordWriter, say, quiet: bool) -> None:
    """The start record, and who and where this rank is in its log (every rank's)."""
    coords = ctx.dims.coords(env.rank)
    writer.write(
        "start", env=env.as_record(), pid=os.getpid(), coords=coords, dims=asdict(ctx.dims), config=to_dict(cfg),
        versions=runtime_versions(),
    )  # fmt: skip
    t = cfg.train
    if not quiet:
        print(
            f"rank {env.rank}/{env.world_size} on {env.host} (node {env.node_rank}, local rank {env.local_rank}), "
            f"device {ctx.device}, pid {os.getpid()}, mesh {coords}",
            flush=True,
        )
        if t.startup_timeout_s:
            print(f"start-up limit: stacks to this log and exit 1 without a first step {t.startup_timeout_s:g} s "
                  "after the start", flush=True)  # fmt: skip
        if t.stall_timeout_s:
            print(
                f"stall watchdog: stacks to this log and exit 1 after {t.stall_timeout_s:g} s without a step",
                flush=True,
            )
    say(
        f"strategy {cfg.parallel.strategy} | world {env.world_size} ({env.launcher}) | dims {asdict(ctx.dims)} | "
        f"device {ctx.device} | {parameter_count(cfg.model):,} parameters"
    )


@dataclass
class Data:
    """What the loop evaluates on: the held-out set, on the device."""

    x_test: torch.Tensor
    y_test: torch.Tensor


def training_batches(cfg: Config, ctx: Context, start: int):
    """The evaluation data, the loader (closed at the end) and its batches from ``start`` on
    (the sampler derives the epoch and offset from the step: a resumed run reads the same)."""
    t = cfg.train
    data, where = training_data(cfg, ctx.device)
    coords = ctx.dims.coords(ctx.env.rank)
    sampler = ShardedSampler(
        len(data.x_train), t.batch_size, t.seed, coords["dp"], ctx.dims.dp, t.grad_accum, data.x_train.device
    )
    loader = make_loader(data, sampler, ctx.device, where)
    return Data(data.x_test.to(ctx.device), data.y_test.to(ctx.device)), loader, loader.batches(start, t.steps)


def optimizer_step(cfg: Config, ctx: Context, trainable: Trainable, scaler):
    """One optimizer step over ``grad_accum`` micro-batches, their losses to the meter: the
    strategy's own forward-backward where it has one (pipeline), else autocast's; gradients
    synchronised once, at the last micro-batch; the scaler's step in fp16."""
    t = cfg.train
    model, optimizer = trainable.model, trainable.optimizer
    autocast = autocast_for(cfg, ctx.device, trainable)
    scale = 1.0 / t.grad_accum

    def forward_backward(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        with autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        scaled = loss * scale if scale != 1.0 else loss
        (scaler.scale(scaled) if scaler else scaled).backward()
        return loss.detach()

    fb = trainable.forward_backward or forward_backward

    def step(meter: LossMeter, batches) -> None:
        for micro in range(t.grad_accum):
            x, y = next(batches)
            inner = micro < t.grad_accum - 1
            with trainable.no_sync() if inner else contextlib.nullcontext():
                meter.add(fb(x, y, scale))
        trainable.finish_grads()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    return step


def stepped(watchdog: StallWatchdog, writer: RecordWriter, step: int, start: int) -> None:
    """A step done: the watchdog armed at this attempt's first (``first_step``: when it began to
    train, what ``cluster logs`` times recovery by), fed at the others."""
    if step == start + 1:
        watchdog.start()
        writer.write("first_step", step=step)
    else:
        watchdog.progress()


class Checkpointer:
    """The loop's checkpoints: resume from the latest, and save a finite state only (``latest``
    never points at nan or inf), each save's cost in the records (goodput's ``checkpoint``:
    what the loop waited for). With ``train.ckpt_async`` the write runs in the background
    (``checkpoint.AsyncSaver``): a save waits for the previous one still writing, the final
    save and the time-limit signal's wait for their own, and each write's outcome is recorded
    (``checkpoint_written``, or ``checkpoint_failed`` with the previous checkpoint latest)."""

    def __init__(self, ctx: Context, trainable: Trainable, scaler, out: Outlets):
        t = ctx.cfg.train
        self.dir, self.trainable, self.scaler, self.layout = t.checkpoints, trainable, scaler, asdict(ctx.dims)
        self.writer, self.say, self.stop_on_nonfinite, self.device = (
            out.writer,
            out.say,
            t.stop_on_nonfinite,
            ctx.device,
        )
        self.unwritable_at = t.unwritable_ckpt_at_step
        # its writer's start waited for less than the stall watchdog and a collective would
        limit = min(checkpoint.WRITER_START_LIMIT_S, t.timeout_s / 2, (t.stall_timeout_s or math.inf) / 2)
        self.saver = checkpoint.AsyncSaver(self.dir, self.device, self.unwritable_at, limit) if t.ckpt_async else None
        if self.saver is not None:
            self.saver.warm_up()

    def resume(self, world_size: int, tp: int) -> int:
        """The step of the latest checkpoint (0 without one), loaded, resharded where it was
        saved by another number of ranks. One that does not load on every rank (partial,
        corrupt: any error reading it) is passed over for the one before, and said; a layout
        it cannot be resharded to (ConfigError) is no damage and stops the run. None loading
        stops it too: the state may hold part of one, and must not train on as if fresh."""
        passed = []
        for found in checkpoint.candidates(self.dir):
            why = ""
            try:
                saved_world = checkpoint.saved_world_size(found)
                start = checkpoint.load(found, self.trainable, self.scaler, tp)
            except (ConfigError, KeyboardInterrupt, SystemExit):
                raise
            except (
                BaseException
            ) as exc:  # whatever keeps it from loading (DCP's CheckpointException is a BaseException)
                lines = [line for line in str(exc).splitlines() if line.strip()]
                why = f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}"
            if on_every_rank(not why, world_size > 1 and dist.is_initialized(), self.device):
                if saved_world != world_size:
                    self.say(f"resharding a {saved_world}-rank checkpoint to {world_size} ranks")
                self.say(f"resumed from {found} (step {start})")
                self.writer.write("resume", step=start, path=str(found), from_world_size=saved_world,
                                  passed_over=passed)  # fmt: skip
                return start
            passed.append(found.name)
            self.say(f"checkpoint {found} does not load ({why or 'on another rank'}): going back to the one before")
        if passed:
            raise RuntimeError(
                f"no checkpoint in {self.dir} loads (tried {', '.join(passed)}): move them away to start over"
            )
        return 0

    def save(self, step: int, meter: LossMeter, distributed: bool, final: bool = False) -> None:
        """``final``: the run ends (or stops at the signal) after it: its write is waited for."""
        if not state_is_finite(meter, self.trainable, distributed):
            last = checkpoint.latest(self.dir)
            message = (
                f"the state at step {step} is non-finite (a nan or inf loss or parameter): not saved; "
                f"the latest checkpoint stays {last.name if last else 'none'}"
            )
            if self.stop_on_nonfinite:
                raise NonFiniteLoss(f"{message}; {NON_FINITE_HINT}")
            self.say(message)
            return
        started = time.perf_counter()
        # the save in flight first; where the writing process did not start, settle turns the saver off
        waited = self.settle(distributed, step) if self.saver is not None else 0.0
        if self.saver is None:
            checkpoint.save(self.dir, step, self.trainable, self.scaler, self.layout, self.unwritable_at)
            self.writer.write("checkpoint", step=step, seconds=round(time.perf_counter() - started, 3))
            return
        self.saver.start(step, self.trainable, self.scaler, self.layout)
        if final:
            self.settle(distributed, step)
        self.writer.write("checkpoint", step=step, seconds=round(time.perf_counter() - started, 3),
                          waited_s=round(waited, 3), asynchronous=True, final=final)  # fmt: skip

    def settle(self, distributed: bool, step: int) -> float:
        """The save in flight written and published (or its failure recorded); the seconds waited."""
        started = time.perf_counter()
        written = self.saver.finish(lambda ok: on_every_rank(ok, distributed, self.device))
        waited = time.perf_counter() - started
        if written is None:
            return waited
        if written.step is None:  # a rank's writing process did not start: every rank saves synchronously
            self.writer.write("checkpoint_failed", step=None, error=written.error)
            print(f"asynchronous checkpoints are off: {written.error}; saving synchronously", flush=True)
            self.saver.close()
            self.saver = None
            return waited
        if written.error:
            last = checkpoint.latest(self.dir)
            self.writer.write("checkpoint_failed", step=written.step, error=written.error)
            print(f"checkpoint at step {written.step} was not written: {written.error}; the latest checkpoint "
                  f"stays {last.name if last else 'none'}", flush=True)  # fmt: skip
        else:
            self.writer.write("checkpoint_written", step=written.step, write_s=round(written.write_s, 3))
        if waited >= 0.05 and written.step != step:
            self.say(f"the save at step {step} waited {waited:.2f} s for step {written.step}'s write (one at a time)")
        return waited

    def close(self) -> None:
        if self.saver is not None:
            self.saver.close()


def log_step(s: LoopState, step: int) -> dict:
    """A step record: the losses since the last (one host sync), an evaluation where it is
    due (and the replicas' check, train.check_sync), to the records, TensorBoard and the log."""
    t, distributed = s.ctx.cfg.train, s.ctx.env.distributed
    record = {"step": step, **s.meter.flush(distributed), "test_loss": None, "test_acc": None}
    if s.schedule.evaluates(step):
        if t.check_sync and s.trainable.synced(step):
            check_replicas(s.trainable, step)
        result = s.trainable.evaluate(s.data.x_test, s.data.y_test)
        if result is not None:
            record["test_loss"], record["test_acc"] = result
    if s.schedule.is_last(step):
        record["final"] = True
        record["state_bytes"] = s.memory
    s.out.writer.write("step", **record)
    s.out.board.step(record)
    s.out.say(format_line(record, t.steps))
    return record


def stop_at_signal(s: LoopState, step: int, sig: signal.Signals, record: dict) -> dict:
    """The time-limit signal came to some rank: every rank saves (unless it just did) and stops."""
    distributed = s.ctx.env.distributed
    if s.schedule.saves_at_signal(step):
        s.ckpt.save(step, s.meter, distributed, final=True)
    elif s.ckpt.saver is not None:  # this step's save is in flight: the job stops only once it is written
        s.ckpt.settle(distributed, step)
    s.out.writer.write("preempted", step=step)
    s.out.say(f"preemption signal ({sig.name}): checkpoint saved at step {step}")
    return {**record, "preempted": True}


def already_complete(start: int, trainable: Trainable, data: Data, writer: RecordWriter, say) -> dict:
    record = {"step": start, "train_loss": None, "local_loss": None, "step_ms": 0.0, "samples_per_s": 0.0}
    record["test_loss"], record["test_acc"] = trainable.evaluate(data.x_test, data.y_test) or (None, None)
    record.update(final=True, state_bytes=state_bytes(trainable))
    writer.write("step", **record)
    say(f"already complete at step {start}")
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


def on_every_rank(flag: bool, distributed: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on all of them (false on none)."""
    return not on_any_rank(not flag, distributed, device)


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
