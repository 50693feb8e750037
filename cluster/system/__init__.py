"""The machine below the kit: ``poll`` (the one polling helper, with its timeout), ``processes``
(a job's processes, read from /proc, and ending them for good), ``shell`` (quoting for the
scripts the kit writes), ``minicluster`` (a real SLURM cluster on this machine, ``make
minicluster``: the standard library alone, so that any python3 starts it before the venv exists)."""
