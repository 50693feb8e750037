"""make test's two sessions (tests/suite.py): one exit status for both; make gpu-check's files."""

import re

import pytest

from tests.conftest import ROOT
from tests.suite import combined


@pytest.mark.parametrize(
    "codes, expected",
    [
        ([0, 0], 0),
        ([1, 0], 1),
        ([0, 1], 1),
        ([0, 5], 0),  # an empty selection in one session fails no tier
        ([5, 0], 0),
        ([5, 5], 5),  # nothing collected anywhere: pytest's 5, which .ci/run reports and passes
        ([5, 1], 1),
        ([2, 1], 2),  # the first failure: the interrupted session's
    ],
)
def test_one_exit_status_for_the_two_sessions(codes, expected):
    assert combined(codes) == expected


def test_make_gpu_check_collects_every_file_that_has_a_gpu_test():
    """gpu-check collects only GPU_TESTS (a GPU box's own interpreter lacks the other files'
    imports): a gpu test in another file would never run."""
    listed = re.search(r"^GPU_TESTS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    gpu = re.compile(r"^(@pytest\.mark\.gpu\b|pytestmark = .*pytest\.mark\.gpu\b)", re.M)
    marked = [p.relative_to(ROOT) for p in (ROOT / "tests").rglob("test_*.py") if gpu.search(p.read_text())]
    assert marked and all(any(str(m).startswith(path) for path in listed) for m in marked), (marked, listed)
