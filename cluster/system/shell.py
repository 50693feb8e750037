"""Words for the batch scripts the kit writes (its own, and the lines it hands submitit)."""

from __future__ import annotations

import shlex


def shell_word(word: str) -> str:
    """Quote for bash, leaving $VARS that we put there ourselves expandable."""
    if "$" in word:
        return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
    return shlex.quote(word)
