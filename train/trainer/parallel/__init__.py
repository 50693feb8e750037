"""Parallel strategies: one plain function per strategy (``apply_<name>`` in ``<name>.py``),
named with the strategy's facts in ``train.contract.strategies.STRATEGIES``."""
