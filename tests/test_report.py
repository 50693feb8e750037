import pytest

from tests.conftest import run_module

pytestmark = pytest.mark.slow


def test_quick_report_writes_markdown_and_plots(tmp_path):
    """`make bench` end to end, in its --quick form (1 round, short runs), into a temporary folder."""
    out = tmp_path / "benchmarks.md"
    result = run_module("cluster.report", "--quick", f"--out={out}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    for needle in (
        "single / minimal",
        "| fsdp@tp2 | 4 |",
        "busbw",
        "Log triage",
        "1024 nodes x 8 GPUs",
        "| param_avg@k4 | 2 |",
        "## Restarts",
    ):
        assert needle in text, needle
    for png in ("throughput.png", "state_bytes.png", "busbw.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
