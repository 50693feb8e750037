"""The built-in trainer (``python -m train``): one rank's run, the training loop, the model,
the data, checkpoints, and ``parallel/`` (one function per strategy)."""
