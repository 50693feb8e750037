"""The MFU benchmark (``bench/report.py``'s ``gpu_mfu``, ``make gpu-check``): its arithmetic on
the CPU, its real run in the gpu tier."""

import pytest
import torch

from bench.report import PEAK_FLOPS, mfu_rows
from tests.support.gpu import cuda


def test_mfu_arithmetic():
    """What gpu_mfu does with the benchmark's rows, without a GPU."""
    rows = mfu_rows([{"strategy": "single", "samples_per_s": 1000.0}], 2e9, "NVIDIA H100 80GB HBM3", "bf16")
    assert rows[0]["tflops"] == pytest.approx(2.0) and rows[0]["mfu"] == pytest.approx(
        2e12 / PEAK_FLOPS["H100"]["bf16"]
    )
    assert mfu_rows([{"samples_per_s": 1.0}], 1.0, "a GPU of no table", "bf16")[0]["mfu"] is None


@pytest.mark.gpu
@cuda
def test_the_mfu_benchmark_end_to_end():
    from bench.report import gpu_mfu

    result = gpu_mfu(rounds=1)
    assert result["device"] == torch.cuda.get_device_name(0) and result["runs"]
    for row in result["runs"]:
        assert row["tflops"] > 0 and (row["mfu"] is None or 0 < row["mfu"] < 1), row
