"""The kit's local launcher: srun's semantics where there is no SLURM (cluster=local), and
inside each node container (cluster=docker). ``controller``: a step's tasks, kill-on-bad-exit,
the controller's account; ``containers``: one container per node through the Docker SDK;
``__main__``: its entry point (``python -P -m cluster.launcher``)."""
