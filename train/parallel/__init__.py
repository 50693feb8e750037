"""Parallel strategies: one plain function per strategy, listed in ``registry.STRATEGIES``.

Kept import-light on purpose: ``train.parallel.mesh`` is pure and the cluster driver uses it
to validate a job's parallel layout without importing torch.
"""
