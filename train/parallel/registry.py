"""The strategy registry: ``parallel.strategy`` name -> the function that applies it."""

from train.parallel.ddp import apply_ddp
from train.parallel.ddp_bucketed import apply_ddp_bucketed
from train.parallel.ddp_naive import apply_ddp_naive
from train.parallel.fsdp import apply_fsdp
from train.parallel.model_parallel import apply_model_parallel
from train.parallel.param_avg import apply_param_avg
from train.parallel.pipeline import apply_pipeline
from train.parallel.single import apply_single
from train.parallel.tp import apply_tp
from train.parallel.zero1 import apply_zero1

STRATEGIES = {
    "single": apply_single,
    "ddp": apply_ddp,
    "ddp_naive": apply_ddp_naive,
    "ddp_bucketed": apply_ddp_bucketed,
    "zero1": apply_zero1,
    "fsdp": apply_fsdp,
    "tp": apply_tp,
    "model_parallel": apply_model_parallel,
    "pipeline": apply_pipeline,
    "param_avg": apply_param_avg,
}
