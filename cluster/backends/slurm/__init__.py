"""SLURM: its backend (``backend``: sbatch of the rendered script, scontrol, scancel), the
restarts inside the allocation that only its batch script runs (``attempts``: what the script
asks between attempts, and the guard; ``attempt_history``: their record), and a Python
function's job through submitit (``functions``)."""
