"""Atomic, resumable checkpoints: ``<run_dir>/checkpoints/step_0000100/`` + a ``latest`` pointer.

More: docs/internals.md, ``train/trainer/checkpoint.py``.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from train.contract.errors import ConfigError
from train.contract.protocol import LATEST, step_name
from train.trainer import dcp_writer
from train.trainer.faults import unwritable_checkpoint
from train.trainer.parallel.common import Trainable

# DCP warns on every call in a single process ("assuming the intent is to save in a single
# process"): that is the intent here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _model(trainable: Trainable) -> torch.nn.Module:
    return trainable.state_modules[0]


def save(
    ckpt_dir: Path,
    step: int,
    trainable: Trainable,
    scaler,
    layout: dict | None = None,
    unwritable_at: int | None = None,
) -> Path:
    """Every rank's part of the checkpoint of ``step``; ``layout`` (the parallel dimensions)
    is kept for a resume on another layout to check against."""
    tmp = begin(ckpt_dir, step, unwritable_at)
    import torch.distributed.checkpoint as dcp  # imported on use: about a second, most runs never save

    dcp.save(_state_dicts(trainable), checkpoint_id=tmp)
    torch.save(extras(step, trainable, scaler, layout), tmp / f"extra_rank{_rank():05d}.pt")
    return publish(ckpt_dir, step)


def begin(ckpt_dir: Path, step: int, unwritable_at: int | None = None) -> Path:
    """The save's temporary directory, made anew by rank 0 (a save killed before left one);
    ``unwritable_at``: ``train.unwritable_ckpt_at_step`` (``train.trainer.faults``)."""
    tmp = temporary(ckpt_dir, step)
    if _rank() == 0:
        _remove(tmp)
        tmp.mkdir(parents=True)
        unwritable_checkpoint(tmp, step, unwritable_at)
    _barrier()
    return tmp


def temporary(ckpt_dir: Path, step: int) -> Path:
    """Where the save of ``step`` is written before it is renamed into place."""
    return ckpt_dir / (step_name(step) + ".tmp")


def _remove(path: Path) -> None:
    """A save's leftover: a directory, or the file ``train.unwritable_ckpt_at_step`` made."""
    if path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def extras(step: int, trainable: Trainable, scaler, layout: dict | None, copy: bool = False) -> dict:
    """This rank's own part: its step, RNG states, scaler, and where they are its own, its
    optimizer shard and parameters (``copy``: cloned to host memory, for a write that runs on
    while the loop trains)."""
    shard = trainable.optimizer_shard
    out = {
        "step": step,
        "world_size": _world_size(),
        "layout": layout,
        "optimizer_shard": shard.state_dict() if shard is not None else None,
        "parameters": _model(trainable).state_dict() if trainable.local_parameters else None,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    if copy:
        out = _to_host(out)
    return out


def _to_host(value):
    """A copy of a nested state in host memory: tensors cloned, containers rebuilt."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_host(v) for v in value)
    return value


def publish(ckpt_dir: Path, step: int) -> Path:
    """Once every rank's part is on disk: the directory renamed into place, then ``latest``
    replaced (a temporary file and a rename), by rank 0; the others wait for it."""
    final, tmp = ckpt_dir / step_name(step), temporary(ckpt_dir, step)
    _barrier()  # every shard is on disk before the directory becomes visible
    if _rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer = ckpt_dir / (LATEST + ".tmp")
        pointer.write_text(step_name(step) + "\n")
        with pointer.open() as f:
            os.fsync(f.fileno())
        pointer.replace(ckpt_dir / LATEST)
    _barrier()
    return final


WARM_UP = ".warm-up"  # the writing process's first, empty save (AsyncSaver.warm_up)


# How long a rank waits for its writing process to start (a fresh interpreter importing torch:
# seconds, tens of them on a loaded machine) before the ranks agree to save synchronously; less
# where the stall watchdog or the collectives' timeout would fire first (AsyncSaver's start_limit_s:
# a rank whose writer failed at once waits that long for its peers in the agreement's all_reduce).
WRITER_START_LIMIT_S = 90.0


@dataclass
class Written:
    """How an asynchronous save ended: its step (None: the warm-up's), the seconds its write
    took, its error."""

    step: int | None
    write_s: float
    error: str | None = None


class AsyncSaver:
    """Checkpoints written in the background (``train.ckpt_async``): DCP's ``async_save`` in a
    process of its own where torch offers one (the write does not compete with the loop for the
    GIL), staged first, so that the loop waits only for the copy of the state to host memory
    (pinned where CUDA is; shared, so the writing process reads it in place) and the next
    optimizer step cannot change what is being written. At most one save is in flight: a save
    that comes while the previous one still writes waits for it (``finish``). ``latest`` moves
    only when every rank's part is written, as a synchronous save's; one that failed on any rank
    leaves the previous checkpoint latest and is reported (``Written.error``)."""

    def __init__(
        self, ckpt_dir: Path, device: torch.device, unwritable_at: int | None = None,
        start_limit_s: float = WRITER_START_LIMIT_S,
    ):  # fmt: skip
        self.dir, self.device, self.unwritable_at = ckpt_dir, device, unwritable_at
        self.start_limit_s = start_limit_s
        self.pending: tuple[int, Future, Future, float] | None = None  # step, DCP's write, the extras', start
        self.stager = None
        self.extras_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kit-ckpt-extras")

    def warm_up(self) -> None:
        """Start the writing process now, in the background of the start-up, with a save of
        nothing (a fresh interpreter importing torch: seconds the first save would wait)."""
        import torch.distributed.checkpoint as dcp  # imported on use, as save's

        kind, self.stager = _async_options(self.device, self.stager)
        where = self.dir / WARM_UP
        future = dcp.async_save({"warm_up": torch.zeros(1)}, checkpoint_id=str(where), storage_writer=writer(where),
                                **kind)  # fmt: skip
        self.pending = (None, getattr(future, "upload_completion", future), None, time.perf_counter())

    def start(self, step: int, trainable: Trainable, scaler, layout: dict) -> None:
        """Stage this rank's state and start writing it; returns once it is staged."""
        import torch.distributed.checkpoint as dcp  # imported on use, as save's

        tmp = begin(self.dir, step, self.unwritable_at)
        kind, self.stager = _async_options(self.device, self.stager)
        future = dcp.async_save(_state_dicts(trainable), checkpoint_id=str(tmp), storage_writer=writer(tmp),
                                async_stager=self.stager, **kind)  # fmt: skip
        staged = extras(step, trainable, scaler, layout, copy=True)
        written = self.extras_writer.submit(torch.save, staged, tmp / f"extra_rank{_rank():05d}.pt")
        self.pending = (step, getattr(future, "upload_completion", future), written, time.perf_counter())

    def finish(self, ok_everywhere) -> Written | None:
        """Wait for the save in flight, then publish it where every rank wrote its part
        (``ok_everywhere(flag)``: the flag agreed on by every rank); None without one, or after
        the warm-up where every rank's writer started (a ``Written`` of step None where one
        did not: the caller saves synchronously from then on)."""
        if self.pending is None:
            return None
        step, future, written, started = self.pending
        self.pending = None
        error = None
        try:
            future.result(timeout=self.start_limit_s if step is None else None)
            if written is not None:
                written.result()
        except (KeyboardInterrupt, SystemExit):
            raise
        except TimeoutError:
            error = f"DCP's writing process did not start in {self.start_limit_s:.0f} s"
        except BaseException as exc:  # disk full, an unwritable directory (DCP's CheckpointException is a
            error = why_not_written(exc)  # BaseException): named, and training goes on
        write_s = time.perf_counter() - started
        if step is None:  # the warm-up's: nothing to publish; agreed on, as a writer that did not
            if _rank() == 0:  # start on one rank leaves the others' waiting for it
                shutil.rmtree(self.dir / WARM_UP, ignore_errors=True)
            if ok_everywhere(error is None):
                return None
            return Written(None, write_s, error or "another rank's writing process did not start")
        if ok_everywhere(error is None):
            publish(self.dir, step)
            return Written(step, write_s)
        where = temporary(self.dir, step)
        if _rank() == 0:
            _remove(where)
        return Written(step, write_s, f"{error or 'another rank could not write its part'}, writing {where}")

    def close(self) -> None:
        """The writing process and the staging buffers released (a save in flight is abandoned:
        its directory stays temporary, the previous checkpoint latest)."""
        self.extras_writer.shutdown(wait=True)
        dcp_writer.stop()
        if self.stager is not None:
            self.stager.close()


def why_not_written(exc: BaseException) -> str:
    """One line: DCP's CheckpointException holds each rank's own exception; the first says why."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, cause = min(failures.items(), key=lambda item: item[0])
        cause = cause[0] if isinstance(cause, tuple) else cause  # (the exception, its frames)
        return f"{type(cause).__name__}: {cause} (rank {rank}; {len(failures)} rank(s) failed)"[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


def _async_options(device: torch.device, stager):
    """DCP's executor (a process where this torch has one and a process group to form the
    writers' own from; one process alone writes from a thread) and its stager (made once,
    reused: its host buffers are allocated at the first save)."""
    from torch.distributed.checkpoint import state_dict_saver  # on use, as save's

    kind = {}
    if hasattr(state_dict_saver, "AsyncCheckpointerType") and dist.is_initialized():
        dcp_writer.install()  # the writers end with their rank, on a port no connection takes
        kind["async_checkpointer_type"] = state_dict_saver.AsyncCheckpointerType.PROCESS
    if stager is None:
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # on use, as save's
        except ImportError:  # an older torch: its own default stager, made at each save
            return kind, None
        stager = DefaultStager(StagingOptions(**staging(device)))
    return kind, stager


def writer(path: Path):
    """DCP's file writer for a state already staged in host memory: nothing to copy ahead from a
    GPU (``per_thread_copy_ahead=0``). Its default, where CUDA is, copies on a stream of its own
    and synchronises it in the writing thread, which train.sync_debug's process-wide "error"
    mode (on in the loop's steps) turns into a failed save; and a writing process would make
    a CUDA context of its own for it."""
    from torch.distributed.checkpoint import FileSystemWriter  # on use, as save's

    return FileSystemWriter(str(path), per_thread_copy_ahead=0)


def staging(device: torch.device) -> dict[str, bool]:
    """How a save's state is copied to host memory (DCP's StagingOptions): from a GPU into pinned
    buffers (a device-to-host copy at the bus's speed, not through a pageable bounce) with
    non-blocking copies waited for once at the end; shared, so that the writing process reads
    the copy in place; in the loop's own thread, so that the next optimizer step cannot change
    what is still being copied."""
    cuda = device.type == "cuda"
    return {"use_pinned_memory": cuda, "use_shared_memory": True, "use_async_staging": False,
            "use_non_blocking_copy": cuda}  # fmt: skip


def latest(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / LATEST
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    return path if path.is_dir() else None


def candidates(ckpt_dir: Path) -> list[Path]:
    """What a resume tries, in order: ``latest``, then every earlier published checkpoint,
    newest first (a step directory is renamed into place once complete: ``*.tmp`` ones are
    not). None where nothing was ever published: the run starts afresh."""
    found = latest(ckpt_dir)
    if found is None:
        return []
    earlier = [p for p in ckpt_dir.glob("step_*") if p.is_dir() and p.name.isascii() and p.name[5:].isdigit()]
    return [found, *sorted((p for p in earlier if p.name < found.name), reverse=True)]


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # heavy: imported when used

    # Optimizer state keyed per parameter name ("param_groups.<fqn>.lr"), not per group index:
    # pipeline stages hold different parameters, and DCP would otherwise deduplicate their
    # "param_groups.0" entries as if replicated, handing each stage another stage's group.
    return StateDictOptions(flatten_optimizer_state_dict=True)


def _state_dicts(trainable: Trainable) -> dict:
    """What DCP saves: the model, and the optimizer unless each rank saves its shard."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict  # heavy: on use

    if trainable.optimizer_shard is not None:
        return {"model": get_model_state_dict(_model(trainable), options=_options())}
    model_sd, optim_sd = get_state_dict(_model(trainable), trainable.optimizer, options=_options())
    return {"model": model_sd, "optim": optim_sd}


def saved_world_size(path: Path) -> int:
    """How many ranks wrote the checkpoint at ``path``."""
    return torch.load(path / f"extra_rank{0:05d}.pt", weights_only=False)["world_size"]


def load(path: Path, trainable: Trainable, scaler, tp: int = 1) -> int:
    """Restore model, optimizer, RNG and scaler from ``path`` into a run of tensor dimension
    ``tp``; returns the step it holds.

    A checkpoint of another rank count is resharded: DCP lays the saved tensors out for this
    run's mesh (replicated, FSDP shards, tensor-parallel shards, pipeline stages, whose layers
    keep their names), and the data position is the step, whose global batch is the same on
    any number of ranks (train.trainer.data.ShardedSampler). A rank the checkpoint had no file for
    takes rank 0's RNG state, scaler and step. State that belongs to one rank of one layout
    (ZeRO-1's optimizer shards, param_avg's per-rank optimizer state) cannot be resharded:
    that is refused with what to do, never loaded wrong. So is a larger tensor dimension than
    the checkpoint's: measured with torch 2.13, tp=2 resumed at tp=4 loads parameters and
    momentum bitwise equal to the saved ones, takes its first step right, and from the second
    step on drifts (1.9e-3 after 20 steps with momentum 0.9; none with momentum 0): its
    optimizer state does not carry on. tp=4 to 2, and 1 to 4, are right (3e-8 to 5e-8)."""
    # heavy: imported when used (a run that never resumes never pays for it)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    own = path / f"extra_rank{_rank():05d}.pt"
    extra = torch.load(own if own.exists() else path / f"extra_rank{0:05d}.pt", weights_only=False)
    shard = trainable.optimizer_shard
    if shard is not None and extra["world_size"] != _world_size():
        raise ConfigError(
            str(path),
            f"holds per-rank optimizer state (ZeRO-1 shards or param_avg's local optimizers) of "
            f"{extra['world_size']} ranks, which cannot be resharded to {_world_size()}: resume on "
            f"{extra['world_size']} ranks, or move the checkpoint away to start over",
        )
    saved_tp = (extra.get("layout") or {}).get("tp", 1)
    if saved_tp > 1 and tp > saved_tp:
        raise ConfigError(
            str(path),
            f"was saved with tensor parallelism tp={saved_tp}; resuming at tp={tp} loads optimizer state that "
            f"does not carry on correctly (measured): resume with parallel.tp={saved_tp} or less",
        )
    state = _state_dicts(trainable)
    dcp.load(state, checkpoint_id=path)
    if shard is not None:
        set_model_state_dict(_model(trainable), state["model"], options=_options())
        shard.load_state_dict(extra["optimizer_shard"])
    else:
        set_state_dict(
            _model(trainable),
            trainable.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_options(),
        )
    if trainable.local_parameters:  # this rank's replica, not the one copy DCP kept
        _model(trainable).load_state_dict(extra["parameters"])
    torch.set_rng_state(extra["rng"])
    if extra["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(extra["cuda_rng"])
    if scaler is not None and extra["scaler"] is not None:
        scaler.load_state_dict(extra["scaler"])
    return extra["step"]
