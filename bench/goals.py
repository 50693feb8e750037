"""The goals the benchmarks' figures are held to, as data: ``bench.markdown`` says each beside
its figure (``Goal.said``), and a test may ask whether a figure meets it (``Goal.met``)."""

from __future__ import annotations

import operator
from dataclasses import dataclass

OPERATORS = {"<": operator.lt, "<=": operator.le, ">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class Goal:
    op: str  # "<", "<=", ">=", ">", or "within" (the figure's distance from zero)
    value: float
    unit: str = ""  # as written after the value: " ms", " s", " MB", " points", ""
    where: str = ""  # the size the goal is set at ("at 1,000 points"), where it depends on one

    def said(self) -> str:
        """``goal < 500 ms``, ``goal <= 1 s at 10,000``."""
        return " ".join(part for part in ("goal", self.op, f"{self.value:g}{self.unit}", self.where) if part)

    def met(self, figure: float) -> bool:
        if self.op == "within":
            return abs(figure) <= self.value
        return OPERATORS[self.op](figure, self.value)


GOALS = {
    "loop_ratio": Goal(">=", 0.97),  # the kit's single-process loop / the minimal hand-written loop
    "plan_ms": Goal("<", 500, " ms"),  # plan of 1024 nodes x 8 GPUs, its JSON included
    "triage_s": Goal("<=", 1.5, " s", "at 16,384 ranks"),  # cluster logs --json, the whole process
    "triage_ratio": Goal("<=", 3, "", "at 16,384 ranks"),  # ... against grep -l Traceback over the same logs
    "sweep_table_s": Goal("<", 3, " s", "at 1,000 points"),
    "runs_listing_s": Goal("<=", 1, " s", "at 10,000"),
    "page_s_1024": Goal("<=", 3, " s", "at 1,024 ranks"),
    "page_mb_1024": Goal("<=", 2, " MB", "at 1,024 ranks"),
    "page_s_16384": Goal("<=", 15, " s", "at 16,384"),
    "page_mb_16384": Goal("<=", 10, " MB", "at 16,384"),
    "page_open_s": Goal("<", 2, " s", "to open"),
    "simulator_points": Goal("within", 3, " points"),  # predicted ETTR against measured
    "async_blocking": Goal("<=", 10, " % of a synchronous save", "at 1 GB and more"),
    "submit_ratio": Goal("<=", 1.3),  # cluster submit to the first step, against a raw sbatch
}
