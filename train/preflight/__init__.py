"""``python -m train.preflight``: is this allocation fit to train (``check.py``); every
collective checked and a bandwidth sweep (``python -m train.preflight.collectives``)."""
