"""What the API's parts share: overrides as ``key=value`` texts, and where notes are said."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.spec import JobSpec

Say = Callable[[str], None]


def value_text(value: Any) -> str:
    """A Python value as an override's text: as YAML reads it back (JSON is YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def override_texts(texts: tuple[str, ...] | list[str] = (), values: dict[str, Any] | None = None) -> list[str]:
    """``key=value`` texts, and keyword overrides."""
    return [*texts, *(f"{k}={value_text(v)}" for k, v in (values or {}).items())]


def source_of(job: str | Path | JobSpec) -> str:
    return "" if isinstance(job, JobSpec) else str(job)


def waits_for(after: list | tuple, condition: str, log_dir: str) -> tuple[list, str]:
    """The parent jobs ``after`` names (``Job``, ``SweepJob``, ids or directories), checked
    (``cluster.dependencies``), with the condition."""
    from cluster.dependencies import parents_of  # here: only a job that waits for others asks

    paths = [str(getattr(p, "job_dir", None) or getattr(p, "path", p)) for p in after]
    return (parents_of(paths, log_dir) if after else []), condition
