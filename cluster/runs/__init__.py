"""A training run across its jobs: the next job of a run (``resume``), one live job writing a
run's checkpoints (``owner``), and every run under a log root (``listing``)."""
