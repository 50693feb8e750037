"""Errors a rank reports, and bad input, importable without torch (the CLI catches them
around the import) and without yaml (`cluster logs` starts without the configuration's machinery)."""


class RankFailed(Exception):
    """This rank's training raised; its traceback is already printed."""


class NonFiniteLoss(RuntimeError):
    """The training loss turned nan or inf (``train.stop_on_nonfinite``)."""


class ConfigError(ValueError):
    """A bad key, value, override or file. ``key`` names it (dotted key or file path)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
