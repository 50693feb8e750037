"""SLURM: its backend (``backend``: sbatch of the rendered script, scontrol, scancel), its part
of restarts inside the allocation (``attempts``: the allocation's nodes, those down, the time
left, a requeue, the guard, and the batch script's entry point; the rest is generic, in
``cluster.restarts``), and a Python function's job through submitit (``functions``)."""
