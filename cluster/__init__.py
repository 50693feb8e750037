"""The cluster driver: job spec -> rank plan -> sbatch script -> submission -> per-rank logs."""
