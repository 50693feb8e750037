"""Reproducible jobs (issue 50), with real local jobs: each job runs the code it was submitted
with, whatever is edited after; ``cluster diff`` says what differs; ``cluster rerun`` gives the
same final loss to the last digit."""

import json
from pathlib import Path

import pytest

from cluster.api import Job, SweepJob
from tests.conftest import run_module
from tests.support.jobs import wait_for_line
from tests.support.repos import SCRIPT, kit_copy, make_repo

pytestmark = pytest.mark.slow


def test_a_sweep_point_runs_the_code_of_the_sweeps_submission_and_diff_shows_only_the_swept_key(tmp_path):
    repo = make_repo(tmp_path / "repo", {"main.py": SCRIPT})
    go = tmp_path / "go"
    (repo / "job.yaml").write_text(
        f"cluster: local\nname: tiny\nprogram:\n  script: main.py\n  args: ['{go}', '0.1']\n"
    )
    # the swept key: the script's learning rate, as its second argument
    started = run_module(
        "cluster", "sweep", "job.yaml", f"log_dir={tmp_path / 'runs'}", "--max-parallel", "1", "--json",
        f"program.args=['{go}','0.1'],['{go}','0.2']", cwd=repo,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    sweep = SweepJob.attach(json.loads(started.stdout.splitlines()[0])["sweep_dir"])
    first = sweep.path / "p0000" / "tiny"
    wait_for_line_in(first, "version one")
    (repo / "main.py").write_text(SCRIPT.replace('"one"', '"two"'))  # edited while point 0 runs
    go.touch()
    table = sweep.wait(timeout=300)
    assert [p["state"] for p in table["points"]] == ["completed", "completed"], table
    second_log = next((sweep.path / "p0001" / "tiny").glob("*/rank_00000.log")).read_text()
    assert "version one" in second_log and "version two" not in second_log
    diff = run_module("cluster", "diff", f"{sweep.path}:0", f"{sweep.path}:1", "--json", cwd=repo)
    assert diff.returncode == 0, diff.stderr
    result = json.loads(diff.stdout)
    assert result["code"]["same"] is True and result["spec"] == {"program.args": [[str(go), "0.1"], [str(go), "0.2"]]}
    assert result["env"] == {} and result["packages"] == {} and result["nodes"] is None
    text = run_module("cluster", "diff", f"{sweep.path}:0", str(sweep.path / "p0001"), cwd=repo).stdout
    assert "code: the same" in text and "program.args:" in text and "loss=0.9" not in text
    assert result["outcome"] == {"metrics.loss": [pytest.approx(0.9), pytest.approx(0.8)]}


def wait_for_line_in(job_root, text: str) -> None:
    from cluster.system.poll import wait_until

    wait_until(lambda: list(job_root.glob("*/rank_00000.log")), 120, "point 0's log")
    wait_for_line(next(job_root.glob("*/rank_00000.log")), text, timeout=120)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A committed copy of the kit, its job A submitted from it and ended."""
    root = kit_copy(tmp_path_factory.mktemp("kit"))
    runs = root / "runs" / "a"
    a, info = submit_in(root, runs)
    assert a.returncode == 0, a.stderr
    return root, runs / "local" / info["job_id"]


FAST = ["train.steps=20", "train.log_every=5", "train.eval_every=10", "tasks_per_node=2", "train.batch_size=64"]


def submit_in(root, runs, *overrides):
    args = ["cluster", "submit", "jobs/local.yaml", f"log_dir={runs}", "--json", "--wait", *FAST, *overrides]
    result = run_module(*args, cwd=root, env={"PYTHONPATH": ""}, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return result, json.loads(lines[0]) if lines else None


def final_loss(job_dir) -> str:
    """Rank 0's last test loss, as its log printed it (every digit it printed)."""
    return (
        [line for line in (job_dir / "rank_00000.log").read_text().splitlines() if "test_loss" in line][-1]
        .split("test_loss ")[1]
        .split()[0]
    )


def test_diff_of_two_jobs_shows_the_edited_hunk_the_changed_key_and_both_losses(kit):
    root, job_a = kit
    loop = root / "train/trainer/loop.py"
    old = "stall watchdog: stacks to this log"
    loop.write_text(loop.read_text().replace(old, "stall watchdog (edited): stacks to this log"))  # one line
    b, info = submit_in(root, root / "runs" / "b", "optim.lr=0.05")
    assert b.returncode == 0, b.stderr
    job_b = root / "runs" / "b" / "local" / info["job_id"]
    assert "stall watchdog (edited)" in (job_b / "rank_00000.log").read_text()
    assert "stall watchdog (edited)" not in (job_a / "rank_00000.log").read_text()
    result = json.loads(run_module("cluster", "diff", str(job_a), str(job_b), "--json", cwd=root).stdout)
    assert [f["path"] for f in result["code"]["files"]] == ["train/trainer/loop.py"]
    hunk = result["code"]["files"][0]
    edited = [line for line in hunk["diff"].splitlines() if line.startswith("+") and "stall watchdog (edited)" in line]
    assert (hunk["added"], hunk["removed"]) == (1, 1) and edited and 'f"stall watchdog (edited): stacks' in edited[0]
    assert result["spec"] == {"optim.lr": [0.1, 0.05]}
    assert result["outcome"]["metrics.test_loss"][0] != result["outcome"]["metrics.test_loss"][1]
    text = run_module("cluster", "diff", str(job_a), str(job_b), cwd=root).stdout
    print(text)
    assert "optim.lr: 0.1 -> 0.05" in text and "metrics.test_loss:" in text and "packages: the same" in text
    now = run_module("cluster", "diff", str(job_a), "--stat", cwd=root)  # against the working tree now
    assert now.returncode == 0, now.stderr
    assert "code: 1 file(s) differ\n  modified train/trainer/loop.py  +1 -1\npackages: the same" in now.stdout
    line = run_module("cluster", "logs", str(job_b), cwd=root).stdout.splitlines()
    assert any(x.startswith("code ") and "+ 1 changed file (snapshot " in x and "+ 7 overrides" in x for x in line), (
        line
    )


def test_rerun_of_a_finished_job_gives_the_same_final_loss_from_its_own_code(kit):
    root, job_a = kit
    (root / "train/trainer/loop.py").write_text(
        (root / "train/trainer/loop.py").read_text().replace("stall watchdog", "edited")
    )
    rerun = run_module("cluster", "rerun", str(job_a), "--json", cwd=root, env={"PYTHONPATH": ""})
    assert rerun.returncode == 0, rerun.stderr
    job = json.loads(rerun.stdout)
    again = Job.attach(job["log_dir"])
    again.wait(timeout=300)
    assert final_loss(again.job_dir) == final_loss(job_a)  # to the last digit printed
    assert "stall watchdog:" in (again.job_dir / "rank_00000.log").read_text()  # its snapshot's code
    same = json.loads(run_module("cluster", "diff", str(job_a), str(again.job_dir), "--json").stdout)
    assert same["code"]["same"] and same["spec"] == {} and same["outcome"] == {}
    assert again.provenance()["rerun_of"] == str(job_a)
    other = Job.attach(job_a).rerun("optim.lr=0.05")  # the Python API's twin, an override on top
    other.wait(timeout=300)
    assert json.loads(run_module("cluster", "diff", str(job_a), str(other.job_dir), "--json").stdout)["spec"] == {
        "optim.lr": [0.1, 0.05]
    }


WHERE = """\
import pkg.helper
def run():
    print(f"code {__file__} {pkg.helper.__file__}", flush=True)
if __name__ == "__main__":
    run()
"""


@pytest.mark.parametrize(
    "program",
    [["program.module=pkg.main"], ["program.function=pkg.main:run"],
     ["program.script=pkg/main.py", "program.launcher=torchrun"]],
    ids=["module", "function", "script-under-torchrun"],
)  # fmt: skip
def test_modules_functions_and_torchruns_workers_import_the_snapshot(program, tmp_path):
    repo = make_repo(tmp_path / "repo", {"pkg/__init__.py": "", "pkg/helper.py": "", "pkg/main.py": WHERE})
    (repo / "job.yaml").write_text("cluster: local\nname: where\nprogram:\n  require_progress: false\n")
    if program[0].startswith("program.script"):  # a script imports its package from its project's root: PYTHONPATH
        (repo / "job.yaml").write_text(
            "cluster: local\nname: where\nenv: {PYTHONPATH: .}\nprogram:\n  require_progress: false\n"
        )
    result = run_module("cluster", "submit", "job.yaml", f"log_dir={tmp_path / 'runs'}", *program, "--wait", "--json",
                        cwd=repo)  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_dir = Path(json.loads(result.stdout.splitlines()[0])["log_dir"])
    line = next(x for x in (job_dir / "rank_00000.log").read_text().splitlines() if " code " in x)
    tree = Job.attach(job_dir).provenance()["code"]["tree"]
    main_file, helper_file = line.split(" code ")[1].split()
    assert (main_file, helper_file) == (f"{tree}/pkg/main.py", f"{tree}/pkg/helper.py")


def test_jobs_cnn_yaml_as_it_is_reads_its_code_from_the_snapshot_and_writes_where_its_paths_point(kit):
    """Relative paths mean what they meant at submission: the ranks' working directory is the
    submission directory, so the shipped spec's ``--ckpt runs/cnn/checkpoint.pt`` and its
    default ``log_dir: runs`` land there; only the script is the snapshot's."""
    root, _ = kit
    local = ["cluster=local", "nodes=1", "gpus_per_node=0", "tasks_per_node=2"]  # the spec's own example
    result = run_module("cluster", "submit", "jobs/cnn.yaml", *local, "--json", "--wait", cwd=root,
                        env={"PYTHONPATH": ""}, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_dir = root / "runs" / "cnn" / json.loads(result.stdout.splitlines()[0])["job_id"]
    tree = Job.attach(job_dir).provenance()["code"]["tree"]
    assert (
        f"script {tree}/jobs/train_cnn.py --steps 400 --ckpt runs/cnn/checkpoint.pt"
        in (job_dir / "rank_00000.log").read_text()
    )
    assert (root / "runs" / "cnn" / "checkpoint.pt").is_file() and not (Path(tree) / "runs").exists()
