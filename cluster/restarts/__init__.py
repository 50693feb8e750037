"""Restarts, one concept: the attempt record (``history``), the pure policy (``policy``) and
the attempts a job makes in its allocation (``attempts``, whose docstring tells how a restart
works end to end); a scheduler supplies only what talks to it (SLURM's:
``cluster.backends.slurm.attempts``). Every reader may import this package."""
