"""The suite's own guards, as a hung or leaking test meets them (issue 75)."""

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

HUNG = textwrap.dedent('''
    import subprocess
    import sys

    import pytest
    import torch  # noqa: F401  (imported at collection: the suite's autouse fixtures import it, seconds under load)


    @pytest.fixture
    def child():
        """A process that holds the test's pipe and never ends, as DCP's orphaned writer did."""
        proc = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"],
                                stdout=subprocess.PIPE)
        yield proc
        proc.kill()
        proc.wait()


    def test_waits_for_ever(child):
        child.communicate()
''')


def test_a_hung_test_fails_within_its_timeout_naming_itself_with_the_stacks_it_waits_on(tmp_path):
    test = tmp_path / "test_hung.py"
    test.write_text(HUNG)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "--timeout=20",
         "-o", "addopts=", "--rootdir", str(tmp_path), str(test)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    assert "test_hung.py::test_waits_for_ever timed out: 1 process(es) of the session still run" in out, out[-4000:]
    assert "Timeout (>20.0s) from pytest-timeout" in out, out[-4000:]
    assert "FAILED" in out and "test_waits_for_ever" in out.split("short test summary")[-1]
    assert "<module> (<string>:2)" in out, out[-4000:]  # the child's own stack, by py-spy
