"""HTML from templates (Jinja2, every value escaped: a metric named ``<script>`` is text), and
pages written whole: a reader never opens half of one."""

from __future__ import annotations

import os
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"


def render(name: str, view: dict) -> str:
    import jinja2  # lazy: for the pages alone

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )  # fmt: skip
    return env.get_template(name).render(**view)


def write_page(path: Path, html: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(html)
    tmp.replace(path)
