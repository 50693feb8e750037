"""``python -m bench.scaling``: how training cost grows with model size, data size and ranks.

Every grid point is a real training run of a fixed number of epochs in fresh processes
(torchrun, the kit's own ``python -m train`` and strategies: ``single`` on one rank, ``ddp``
on more). Time to train = steps x the steady-state step time (the median of the log intervals after
the first; start-up and evaluation excluded). The cost model is grounded in what the machine does,

    step time = t0 + k * kernels(model, batch)

where ``kernels`` is measured here, in milliseconds, for every configuration: the three matrix
multiplies of each Linear layer's forward and backward at that batch, timed on their own
(cache effects and the BLAS's blocking included, which no power law of the parameter count
captures). t0 (the loop's fixed per-step cost: Python, kernel launches, the optimizer) and k
(the loop's overhead on its matmuls) are fitted on the single-rank points, checked on held-out
points and saved, so ``--predict`` answers "how long will my run take" for a configuration
that was never run, by timing its kernels. Figures are from one run on one machine.

``kernels`` times a step's matmuls, ``study`` runs the grid, ``fit`` fits and predicts,
``report`` and ``plot`` show it, ``__main__`` is its command line.
"""
