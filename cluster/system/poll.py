"""The one polling helper: wait for a condition, with a timeout, never forever by accident."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """``wait_until`` gave up; the message says what it waited for and how long."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "the condition", interval: float = 0.5) -> T:
    """Call ``predicate`` until it returns something true and return that; raise
    :class:`WaitTimeout` after ``timeout`` seconds (``math.inf``: wait as long as it takes, for
    callers a person can interrupt). The predicate is checked once more at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"gave up after {timeout:g} s waiting for {what}")
        time.sleep(min(interval, left) if not math.isinf(left) else interval)
