"""Sweeps and the Python API: the grid, validation of every point, the results table on
synthetic job directories, and real local sweeps (slow)."""

import json
import re
import subprocess
import sys

import pytest

import cluster
from cluster.api import SweepJob, override_texts
from cluster.logs.series import program_values
from cluster.sweeps.grid import grid_points, parse_grid, read_points, sweep_points
from cluster.sweeps.table import format_sweep
from fixtures.synthetic import make_job, make_sweep
from tests.conftest import run_module


def test_the_grid_is_the_cartesian_product_of_comma_separated_values():
    fixed, axes = parse_grid(["optim.lr=0.01,0.1", "nodes=2", "parallel.strategy=ddp,fsdp", "train.dims=[1,2]"])
    assert fixed == ["nodes=2", "train.dims=[1,2]"]  # a YAML list is one value
    assert grid_points(axes) == [
        ["optim.lr=0.01", "parallel.strategy=ddp"],
        ["optim.lr=0.01", "parallel.strategy=fsdp"],
        ["optim.lr=0.1", "parallel.strategy=ddp"],
        ["optim.lr=0.1", "parallel.strategy=fsdp"],
    ]


def test_a_list_valued_key_is_swept_by_commas_between_its_lists():
    """A program's args are a list: its values are whole YAML lists, commas between them; a
    comma inside brackets, braces or quotes is the value's own."""
    fixed, axes = parse_grid(['program.args=["--max-steps","20"],["--max-steps","30"]', 'tag="a,b"', "x={a: 1, b: 2}"])
    assert fixed == ['tag="a,b"', "x={a: 1, b: 2}"]
    assert axes == [("program.args", ['["--max-steps","20"]', '["--max-steps","30"]'])]
    for bad, words in (("program.args=[1,2", "unbalanced brackets"), ("lr", "malformed override"),
                       ("program.args=[1,],[", "unbalanced brackets")):  # fmt: skip
        with pytest.raises(cluster.ConfigError) as raised:
            parse_grid([bad])
        assert words in str(raised.value) and "\n" not in str(raised.value)


def test_python_values_and_listed_points_become_overrides(tmp_path):
    assert override_texts(["a=1"], {"train.steps": 200, "x.flag": True, "s": "fsdp"}) == [
        "a=1", "train.steps=200", "x.flag=true", "s=fsdp"]  # fmt: skip
    points = tmp_path / "points.yaml"
    points.write_text("- {optim.lr: 0.1, parallel.strategy: ddp}\n- {optim.lr: 1.0}\n")
    assert read_points(str(points)) == [["optim.lr=0.1", "parallel.strategy=ddp"], ["optim.lr=1.0"]]
    with pytest.raises(cluster.ConfigError, match="either a list of points or swept values"):
        sweep_points(["optim.lr=0.1,1"], listed=read_points(str(points)))


@pytest.mark.parametrize(
    "args, key, point",
    [
        (["optim.lr=0.1,1", "parallel.strategy=ddp,fsdp,tp", "parallel.tp=3"], "parallel.tp", "point 0"),
        (["optim.lr=0.1,1", "train.no_such=1,2"], "train.no_such", "point 0"),
        (["nodes=1,0"], "nodes", "point 1: nodes=0"),  # no job has no node
    ],
)
def test_an_invalid_point_exits_2_naming_the_point_and_the_key_and_nothing_runs(tmp_path, args, key, point):
    result = run_module("cluster", "sweep", "jobs/local.yaml", *args, f"log_dir={tmp_path}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {key}:") and point in result.stderr, result.stderr
    assert not list(tmp_path.rglob("*"))  # nothing created, nothing submitted


def test_the_dry_run_lists_every_point_and_what_point_0_runs(tmp_path):
    result = run_module("cluster", "sweep", "jobs/local.yaml", "optim.lr=0.1,1", "parallel.strategy=ddp,zero1",
                        f"log_dir={tmp_path}", "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "4 point(s) of jobs/local.yaml" in result.stdout
    assert "point 3: optim.lr=1 parallel.strategy=zero1" in result.stdout
    assert " -P -m train " in result.stdout and not list(tmp_path.rglob("*"))  # python, python3: the venv's


def test_the_table_has_a_row_per_point_the_culprit_of_a_failed_one_and_the_best(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", ["ok", "crash", "ok", "ok"])
    table = SweepJob(sweep).table()
    assert [r["state"] for r in table["points"]] == ["completed", "failed", "completed", "completed"]
    assert table["points"][1]["first_failure"]["rank"] == 1
    assert table["best"] == {"point": 3, "overrides": ["optim.lr=0.4"], "test_loss": pytest.approx(0.7)}
    assert table["states"] == {"completed": 3, "failed": 1}
    text = format_sweep(table)
    assert re.search(r"3 +optim.lr=0.4 +completed .*<- best", text)
    assert "rank 1: RuntimeError: CUDA error" in text
    plot = tmp_path / "sweep.png"
    result = run_module("cluster", "logs", str(sweep.path), "--json", "--metric", "test_loss", "--mode", "max",
                        "--plot", str(plot))  # fmt: skip
    assert result.returncode == 1 and json.loads(result.stdout)["best"]["point"] == 0  # a point failed: exit 1
    assert plot.read_bytes()[:4] == b"\x89PNG"  # the metric against optim.lr


def test_a_programs_metrics_are_the_last_values_rank_0_printed(tmp_path):
    """A job from before metrics files: its log's end, read by the same parser (train.contract.metrics)."""
    job = make_job(tmp_path / "j", world=1, lines=3)
    log = job / "rank_00000.log"
    log.write_text(
        log.read_text() + "epoch=3 val_loss=0.25 note=x\n" + '{"val_acc": 0.9, "name": "a"}\n' + "val_loss=0.2\n"
    )
    from cluster.jobdir import JobDir

    # its step lines ("step 2/3  train_loss 1.0000 ...") too
    assert program_values(JobDir(job)) == {"train_loss": 1.0, "epoch": 3.0, "val_loss": 0.2, "val_acc": 0.9}


def test_hugging_faces_metrics_dicts_are_read_after_its_progress_bar(tmp_path):
    """Trainer prints a Python dict, its numbers as strings, after tqdm's last "\\r"; its last
    values are the point's metrics, and its loss is the table's default metric."""
    from cluster.jobdir import JobDir
    from cluster.sweeps.table import LOSSES

    job = make_job(tmp_path / "j", world=1, lines=3)
    log = job / "rank_00000.log"
    bar = " 50%|#####     | 5/10 [00:00<00:00, 64.37it/s]"
    log.write_text(log.read_text() + f"2026-11-27T06:04:54.565 {bar}\r{' ' * 20}{{'loss': '4.704', 'grad_norm': "
                   "'0.6752', 'learning_rate': '0.0006', 'epoch': '0.1562', 'note': 'x'}\n"
                   f"{bar}\r   {{'loss': '4.5', 'epoch': 0.3}}\r{bar}\n{{'train_loss': '4.6', 'x': __import__('os')}}\n")  # fmt: skip
    assert program_values(JobDir(job)) == {
        "train_loss": 1.0, "loss": 4.5, "grad_norm": 0.6752, "learning_rate": 0.0006, "epoch": 0.3,
    }  # fmt: skip
    assert "loss" in LOSSES  # a log is data: the dict with a call in it is no metric


def test_the_api_is_the_package(tmp_path):
    """`import cluster` is enough, and importing it starts nothing heavy (the ranks import it)."""
    code = ("import sys, cluster; print('cluster.api' in sys.modules, callable(cluster.submit), cluster.Job.__name__, "
            "callable(cluster.sweep), callable(cluster.submit))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "Job", "True", "True"]  # no submodule shadows a name of the API


def test_a_slurm_sweep_is_one_array_when_its_points_share_an_allocation(tmp_path):
    from cluster.backends import get
    from cluster.sweeps.directory import point_overrides
    from cluster.sweeps.grid import submissions

    slurm = get("slurm")
    same = [["optim.lr=0.1"], ["optim.lr=1"], ["optim.lr=10"]]
    jobs = submissions("jobs/multi_node.yaml", [point_overrides([], p, tmp_path, i) for i, p in enumerate(same)], slurm)
    script = slurm.array_script(jobs, [0, 1, 2], 2, tmp_path)
    assert "#SBATCH --array=0-2%2" in script and f"#SBATCH --output={tmp_path}/slurm-%A_%a.log" in script
    assert script.count("#SBATCH --output") == 1 and "#SBATCH --nodes=2" in script
    assert f"  2) ROOT={tmp_path}/p0002/multi-node ;;" in script
    assert f'JOB_DIR="{tmp_path}/p0000/multi-node/${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"' in jobs[0].script
    other = submissions(
        "jobs/multi_node.yaml", [point_overrides([], [f"nodes={n}"], tmp_path, n) for n in (1, 2)], slurm
    )
    assert slurm.array_script(other, [1, 2], 2, tmp_path) is None  # one array asks for one allocation
    assert not list(tmp_path.iterdir())  # pure: nothing written


def test_a_slurm_sweeps_dry_run_prints_the_array_and_the_points(tmp_path):
    result = run_module("cluster", "sweep", "jobs/multi_node.yaml", "optim.lr=0.1,1", f"log_dir={tmp_path}",
                        "--max-parallel", "1", "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=0-1%1" in result.stdout and "point 1: optim.lr=1" in result.stdout
    assert 'exec bash "$ROOT/array-task.sbatch"' in result.stdout and not list(tmp_path.rglob("*"))


def test_a_jobspec_object_and_keyword_overrides_are_the_cli_s_spec_and_overrides(tmp_path):
    from cluster.spec import JobSpec
    from train.contract.config import load

    text = cluster.dry_run("jobs/local.yaml", "train.steps=7", tasks_per_node=2, log_dir=str(tmp_path))
    cli = run_module("cluster", "submit", "jobs/local.yaml", "train.steps=7", "tasks_per_node=2", f"log_dir={tmp_path}",
                     "--dry-run")  # fmt: skip
    assert text in cli.stdout and "steps: 7" in text  # the CLI prints the plan, then the same text
    spec = load(JobSpec, "jobs/local.yaml")  # a spec object: the same, but for the file it came from
    from_object = cluster.dry_run(spec, "train.steps=7", tasks_per_node=2, log_dir=str(tmp_path))
    assert from_object == text.replace(", rendered from jobs/local.yaml", "")
    with pytest.raises(cluster.ConfigError) as bad:
        cluster.dry_run(spec, **{"parallel.strategy": "nosuch"})
    assert bad.value.key == "parallel.strategy"
    assert not list(tmp_path.iterdir())
