"""torch's DistributedDataParallel: bucketed gradient all_reduce overlapped with backward."""

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.parallel.common import Context, Trainable, forward_eval


def apply_ddp(model: nn.Module, ctx: Context) -> Trainable:
    if ctx.dims.tp > 1:  # ddp x tp: tensor parallel inside the node, DDP across
        from train.parallel.tp import apply_tp

        return apply_tp(model, ctx)
    model = model.to(ctx.device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=ctx.cfg.parallel.bucket_mb,
    )
    return Trainable(
        model=ddp,
        optimizer=ctx.optimizer(ddp.parameters()),
        # Evaluation of the replicated model on rank 0 only, bypassing DDP's hooks.
        evaluate=forward_eval(model) if ctx.is_first_rank else Trainable.evaluate,
        replica_group=ctx.dp_group(),
        no_sync=ddp.no_sync,
        reports=ctx.is_first_rank,
        state_modules=[model],
    )
