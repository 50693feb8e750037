"""Real jobs' views: a nanoGPT-shaped script through the kit gives its loss to ``cluster logs``,
the page and TensorBoard with no line of the kit in it, and ``cluster logs --follow`` prints
each of the configuration lines its 4 ranks print alike once; the built-in trainer's rank 0
writes TensorBoard's events as it trains, and ``--wait`` ends with the job's page."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_module
from tests.support.jobs import logs_json, submit, wait_for_step
from tests.unit.test_page import scalars
from train.contract.protocol import TENSORBOARD

pytestmark = pytest.mark.slow

NANOGPT = ROOT / "tests" / "support" / "clients" / "nanogpt_train.py"


def test_a_nanogpt_shaped_script_shows_its_loss_everywhere_and_its_ranks_alike_lines_once(tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, f"program.script={NANOGPT}", "tasks_per_node=4",
                          'program.args=["--max-iters", "40", "--step-s", "0.05"]', wait=False)  # fmt: skip
    assert info is not None, result.stderr
    job = Path(info["log_dir"])
    wait_for_step(job, 0, None)  # the job is under way: --follow reads it from its first line, live
    with subprocess.Popen([sys.executable, "-m", "cluster", "page", str(job), "--follow", "--interval", "0.5"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as paging:  # fmt: skip
        followed = run_module("cluster", "logs", str(job), "--follow", timeout=300)
        paged, said = paging.communicate(timeout=120)
    # the page said the job was running, was written again until it ended, and then said so
    assert paging.returncode == 0 and "running: 4 ranks" in said and paged.startswith("completed: 4 ranks"), said
    assert followed.returncode == 0, followed.stderr[-2000:]
    lines = followed.stdout.splitlines()
    for i in range(20):  # every rank printed each; each is shown once, with the ranks that wrote it
        said = [line for line in lines if line.endswith(f"Overriding: setting_{i:02d} = {i * 7}")]
        assert len(said) == 1 and said[0].startswith("[ranks 0-3] "), said
    assert sum("tokens per iteration will be: 4,096" in line for line in lines) == 1
    assert sum(bool(re.match(r"\[\d\] .*rank \d/4 on ", line)) for line in lines) == 4  # each rank's own line

    code, report = logs_json(job)
    assert code.returncode == 0 and report["ranks"][0]["last_loss"] is not None  # the loss column: rank 0 printed it
    info = run_module("cluster", "page", str(job), "--json")
    assert info.returncode == 0, info.stderr
    html = (job / "page.html").read_text()
    assert 'id="series-loss-ranks-0"' in html and 'id="series-val_loss-ranks-0"' in html
    found = scalars(job / TENSORBOARD)
    assert [s for s, _ in found["metrics/loss"]] == list(range(0, 41, 5))  # the line's own step: nanoGPT's iter
    assert [s for s, _ in found["metrics/val_loss"]] == [0, 20, 40]
    assert found["metrics/loss"][-1][1] < found["metrics/loss"][0][1]  # it trained


def test_the_built_in_trainer_writes_tensorboard_as_it_trains_and_wait_ends_with_the_page(tmp_path):
    result = run_module("cluster", "submit", "jobs/local.yaml", f"log_dir={tmp_path}", "train.steps=300",
                        "train.log_every=50", "--wait", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    page = re.search(r"^page: file://(\S+)$", result.stdout, re.M)
    assert page and Path(page.group(1)).exists()
    job = Path(page.group(1)).parent
    found = scalars(job / TENSORBOARD)
    assert [s for s, _ in found["metrics/train_loss"]] == [50, 100, 150, 200, 250, 300]  # rank 0's, as it trained
    assert [s for s, _ in found["metrics/test_loss"]] == [100, 200, 300]
    assert [s for s, _ in found["step_time_ms/median"]] == [50, 100, 150, 200, 250, 300]  # the kit's, at the end
    assert 0 < found["goodput/ettr"][-1][1] <= 1
