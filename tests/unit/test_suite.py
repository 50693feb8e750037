"""make test's two sessions (tests/suite.py): one exit status for both."""

import pytest

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
