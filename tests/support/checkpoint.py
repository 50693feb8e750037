"""What the tests of checkpoint in several tiers share (tests/*/test_checkpoint.py)."""

from tests.support.strategies import trained_params

BASE = ["train.log_every=10", "train.eval_every=40", "train.ckpt_every=10", "optim.momentum=0.9"]


def params_after(run_dir, steps, *overrides) -> dict:
    return trained_params(*BASE, *overrides, f"train.run_dir={run_dir}", f"train.steps={steps}")


def final_params(ckpt) -> dict:
    """The built-in model's parameters in the checkpoint ``ckpt`` (a step's folder), read on the CPU."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from train.contract.config import ModelConfig
    from train.trainer.model import build_mlp

    state = {"model": build_mlp(ModelConfig(), 0).state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=ckpt)
    return state["model"]
