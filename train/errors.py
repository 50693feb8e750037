"""Errors a rank reports, importable without torch (the CLI catches them around the import)."""


class RankFailed(Exception):
    """This rank's training raised; its traceback is already printed."""


class NonFiniteLoss(RuntimeError):
    """The training loss turned nan or inf (``train.stop_on_nonfinite``)."""
