"""``python -m cluster``: the command line (``cluster.cli``).

``python -m`` puts the working directory first on the path, where a user's project has its own
``train.py`` or ``model.py`` (nanoGPT's does): the kit's ``import train`` would import theirs, and
run it. So the working directory gives way to the kit's own root before anything else is
imported (a ``cluster.py`` there shadows the package itself, which Python decides before any of
the kit runs: the ``cluster-kit`` command never looks in the working directory)."""

import os
import sys

kit_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
here = os.getcwd()
if os.path.realpath(here) != os.path.realpath(kit_root):  # in the kit's own checkout, the two are one
    sys.path[:] = [kit_root, *(p for p in sys.path if p not in ("", here, kit_root))]

from cluster.cli import cli  # noqa: E402  (after the path above: the kit's own train, not the user's)

if __name__ == "__main__":
    cli()
