"""The strategy registry: ``parallel.strategy`` name -> the function that applies it."""

from train.parallel.single import apply_single

STRATEGIES = {
    "single": apply_single,
}
