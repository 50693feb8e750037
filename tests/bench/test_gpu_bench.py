"""The GPU benchmarks (``bench/gpu.py``, ``bench/checkpoints.py --device cuda``, ``make gpu-check``):
their arithmetic and whole runs on the CPU (every contender, the tables, the start-up probe),
their real runs in the gpu tier and gpu-check."""

import json

import pytest
import torch

from bench import checkpoints
from bench.gpu import PEAK_FLOPS, main, mfu, peak_flops, table
from tests.conftest import run_module
from tests.support.gpu import cuda

SMALL = ["model.dim_in=64", "model.dim_hidden=64", "model.n_classes=8", "data.train_size=1024",
         "data.test_size=128", "train.batch_size=64"]  # fmt: skip


def test_mfu_arithmetic():
    assert mfu(494.5, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(494.5e12 / PEAK_FLOPS["H100"]["bf16"])
    assert peak_flops("NVIDIA H200", "fp32") == 67e12
    assert mfu(1.0, "a GPU of no table", "bf16") is None


@pytest.mark.slow
def test_the_gpu_benchmark_runs_whole_on_the_cpu(capsys):
    """Every row of a CPU run: the ceilings, a hand and a kit loop per precision (fp16 needs
    CUDA: left out here), each kit row with its ratio to the hand loop of its precision, the
    start-up probe of a fresh process; then the table it prints."""
    on_cpu = ["--device", "cpu"] if torch.cuda.is_available() else []  # else the default, auto, means the CPU
    assert main([*on_cpu, "--rounds", "2", "--steps", "8", "--json", *SMALL]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(r["loop"], r["precision"]): r for r in result["rows"]}
    assert set(rows) == {("matmul", "bf16"), ("matmul", "fp32")} | {
        (loop, p) for loop in ("hand", "kit") for p in ("fp32", "bf16", "bf16_params")
    }
    for (loop, _), r in rows.items():
        assert r["tflops"] > 0 and r["mfu"] is None  # no peak for a CPU
        assert ("vs_hand" in r) == (loop == "kit") and r.get("vs_hand", 1) > 0
    assert result["threads"] == 8  # jobs/bench_gpu.yaml's cpus_per_task, not one
    startup = result["startup"]
    assert startup["import_torch_s"] > 0 and startup["to_first_step_s"] > startup["first_step_s"] > 0
    assert startup["hand"]["first_step_s"] > 0 and startup["hand"]["context_s"] >= 0
    text = "\n".join(table(result))
    assert "| kit | bf16_params |" in text and "to the end of its first step" in text


@pytest.mark.slow
def test_the_checkpoint_benchmark_runs_whole_on_the_cpu():
    """bench.checkpoints as make gpu-check runs it with --device cuda, here on the CPU: a row per
    size naming its device (in a process of its own: it forms a process group), then its table."""
    result = run_module("bench.checkpoints", "--sizes-mb", "4", "--rounds", "1", "--device", "cpu", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(result.stdout)["sizes"]
    assert row["device"] == "CPU" and row["state_mb"] == 4
    assert row["sync_s"] > 0 and row["async_blocking_s"] > 0 and row["async_write_s"] > 0
    assert "| 4 MB | CPU |" in "\n".join(checkpoints.table({"sizes": [row]}))


def test_bad_precisions_exit_2_naming_them(capsys):
    assert main(["--precisions", "fp32,fp8"]) == 2
    assert "--precisions" in capsys.readouterr().err


@pytest.mark.gpu
@cuda
def test_the_gpu_benchmark_end_to_end(capsys):
    """jobs/bench_gpu.yaml on this GPU, every precision and train.compile: sane figures (the
    goals are read from the table, not asserted: speed belongs in benchmarks)."""
    assert main(["--rounds", "1", "--steps", "40", "--compile", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device"] == torch.cuda.get_device_name(0)
    for row in result["rows"]:
        assert row["tflops"] > 0 and (row["mfu"] is None or 0 < row["mfu"] < 1), row
