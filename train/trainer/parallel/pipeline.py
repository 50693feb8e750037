"""Pipeline parallel: one stage per rank, micro-batches scheduled by torch.distributed.pipelining.

The batch is cut into ``parallel.microbatches``; GPipe runs all forwards then all backwards,
1F1B interleaves them to bound activation memory. Micro-batches are the pipeline's own
gradient accumulation (the schedule averages the micro-batch gradients), so
``train.grad_accum`` must stay 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from train.contract.errors import ConfigError
from train.trainer.model import layer_dims
from train.trainer.parallel.common import Context, Trainable
from train.trainer.parallel.stages import stage_bounds, stage_module

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}  # in torch.distributed.pipelining


def stage_class(base: type) -> type:
    """torch's PipelineStage, with the first exchange between neighbours in one dtype.

    torch 2.9 sends an int64 there and receives into a float32 (pytorch#165143, fixed by
    #165539 in 2.10): gloo aborts the rank ("8 vs 4. Received data size doesn't match"), and
    over NCCL the mismatch is undefined. On versions that already agree this changes nothing.
    """

    class Stage(base):
        def _get_init_p2p_neighbors_ops(self) -> list[dist.P2POp]:
            ops = super()._get_init_p2p_neighbors_ops()
            for op in ops:
                op.tensor = op.tensor.float()
            return ops

    return Stage


def apply_pipeline(model: nn.Module, ctx: Context) -> Trainable:
    cfg, rank, stages = ctx.cfg, ctx.env.rank, ctx.dims.pp
    ctx.require_precision("fp32")
    if cfg.train.grad_accum != 1:
        raise ConfigError("train.grad_accum", "pipeline accumulates over parallel.microbatches; keep grad_accum 1")
    if cfg.train.batch_size % cfg.parallel.microbatches:
        raise ConfigError("parallel.microbatches", f"{cfg.parallel.microbatches} does not divide train.batch_size")
    start, end = stage_bounds(model, stages)[rank]
    module = stage_module(model, start, end).to(ctx.device)
    first, last = rank == 0, rank == stages - 1
    from torch.distributed import pipelining  # heavy: imported when used

    stage = stage_class(pipelining.PipelineStage)(module, rank, stages, ctx.device)
    loss_fn = nn.functional.cross_entropy
    schedule = getattr(pipelining, SCHEDULES[cfg.parallel.schedule])(
        stage, n_microbatches=cfg.parallel.microbatches, loss_fn=loss_fn
    )

    def forward_backward(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor | None:
        if first:
            schedule.step(x)
            return None
        if last:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            return torch.stack(losses).mean().detach()
        schedule.step()
        return None

    in_dim = layer_dims(cfg.model)[start // 2][0]  # Linear i sits at module index 2i

    @torch.no_grad()
    def evaluate(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float] | None:
        """Forward of the whole held-out set, stage to stage (no micro-batching needed)."""
        h = x if first else torch.empty(len(x), in_dim, device=ctx.device)
        if not first:
            dist.recv(h, src=rank - 1)
        out = module(h)
        if not last:
            dist.send(out.contiguous(), dst=rank + 1)
            return None
        return loss_fn(out, y).item(), (out.argmax(1) == y).float().mean().item()

    return Trainable(
        model=module,
        optimizer=ctx.optimizer(module.parameters()),
        evaluate=evaluate,
        forward_backward=forward_backward,
        reports=last,
        state_modules=[module],
    )
