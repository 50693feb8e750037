"""``python -m cluster``: the command line (``cluster.cli``)."""

from cluster.cli import cli

if __name__ == "__main__":
    cli()
