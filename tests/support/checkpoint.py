"""What the tests of checkpoint in several tiers share (tests/*/test_checkpoint.py)."""

from tests.support.strategies import trained_params

BASE = ["train.log_every=10", "train.eval_every=40", "train.ckpt_every=10", "optim.momentum=0.9"]


def params_after(run_dir, steps, *overrides) -> dict:
    return trained_params(*BASE, *overrides, f"train.run_dir={run_dir}", f"train.steps={steps}")
