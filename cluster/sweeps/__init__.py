"""Sweeps: ``grid`` (the points of a grid or a list, validated, and started: one job array or
the runner), ``directory`` (the sweep's directory and its files), ``runner`` (submits the
points, N at once, where there are no arrays), ``table`` (a row per point, the best)."""
