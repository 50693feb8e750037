import json

import pytest

from tests.conftest import run_module, torchrun
from train.preflight.collectives import parse_size, sizes_between

pytestmark = pytest.mark.slow


def test_size_parsing():
    assert parse_size("1KiB") == 1024 and parse_size("64M") == 64 << 20 and parse_size("512") == 512
    assert sizes_between(1024, 16384, 4) == [1024, 4096, 16384]


def test_collectives_are_correct_and_swept():
    result = torchrun(3, "train.preflight.collectives", "--json", "--max-bytes=64KiB")
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["world_size"] == 3 and len(out["checked"]) == 7
    assert [r["bytes"] for r in out["sweep"]] == [1024, 4096, 16384, 65536]
    row = out["sweep"][-1]
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 4 / 3)


def test_bench_json_shape():
    result = run_module("bench.strategies", "--json", "--rounds=2", "--steps=20", "--strategies=single,minimal,ddp_bucketed",
                        "--nprocs=2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout)["runs"]
    assert [(r["strategy"], r["nprocs"]) for r in runs] == [("single", 1), ("minimal", 1), ("ddp_bucketed", 2)]
    assert all(r["samples_per_s"] > 0 and r["step_ms"] > 0 and len(r["rounds"]) == 2 for r in runs)
    assert runs[0]["vs_first"] == 1.0 and all(r["vs_first"] > 0 and r["vs_first_spread"] >= 0 for r in runs)
    assert len(runs[2]["state_bytes_per_rank"]) == 2


def test_bench_rejects_unknown_strategy():
    result = run_module("bench.strategies", "--strategies=single,fsd")
    assert result.returncode == 2 and "parallel.strategy" in result.stderr
