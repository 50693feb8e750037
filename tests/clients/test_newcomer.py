"""A newcomer's first hour (issue 71), on this machine: a script the kit has never seen, in a
clean directory, submitted with ``cluster-kit`` as the README shows, no YAML. The SLURM half
(the same script on the minicluster, requests it can never meet refused) is in
``tests/slurm/test_slurm.py``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.clients

KIT = str(Path(sys.executable).parent / "cluster-kit")  # the command pip installed, as a user runs it

# Written for torchrun, as people write one: its own flags, gloo, a print every few steps.
SCRIPT = """\
import argparse, os
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"I am rank {rank} of {dist.get_world_size()}, node {os.environ['GROUP_RANK']}, "
      f"local rank {os.environ['LOCAL_RANK']} of {os.environ['LOCAL_WORLD_SIZE']}", flush=True)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(step):
    if step == args.fail_at and rank == 1:
        raise ValueError(f"bad batch at step {step}")
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True) - 0.1 * torch.randn(16, 1)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


for step in range(1, args.steps + 1):
    loss = train_step(step)
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss:.4f}", flush=True)
dist.destroy_process_group()
"""


def kit(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([KIT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "script.py").write_text(SCRIPT)
    return tmp_path


def job_of(done: subprocess.CompletedProcess, cwd: Path) -> Path:
    return cwd / json.loads(done.stdout.splitlines()[0])["log_dir"]


def report_of(job_dir: Path, cwd: Path) -> dict:
    return json.loads(kit(cwd, "logs", str(job_dir), "--json").stdout)


def test_a_script_is_a_job_and_its_printed_loss_is_read(project):
    done = kit(project, "submit", "script.py", "--cluster", "local", "--wait", "--json", "--", "--steps", "50")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    job_dir = job_of(done, project)
    assert job_dir.parent == project / "runs" / "script"
    rank0 = report_of(job_dir, project)["ranks"][0]
    printed = [line for line in (job_dir / "rank_00000.log").read_text().splitlines() if " step 50 loss " in line]
    assert rank0["last_step"] == 50 and rank0["last_loss"] == float(printed[-1].split()[-1])  # "step 50 loss X"


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_two_nodes_are_emulated_on_this_machine(project, launcher):
    """``nodes=2`` with ``cluster=local``: each node's ranks with their node rank, their local
    ranks and their own logs, under both launchers."""
    done = kit(project, "submit", "script.py", "nodes=2", "cluster=local", "--nproc-per-node", "2",
               f"program.launcher={launcher}", "--wait", "--json", "--", "--steps", "20")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    job_dir = job_of(done, project)
    said = {}
    for rank in range(4):
        (line,) = [ln for ln in (job_dir / f"rank_{rank:05d}.log").read_text().splitlines() if "I am rank" in ln]
        said[rank] = line.split("I am ")[1]
    assert said == {r: f"rank {r} of 4, node {r // 2}, local rank {r % 2} of 2" for r in range(4)}
    assert [r["node"] for r in report_of(job_dir, project)["ranks"]] == [0, 0, 1, 1]


def test_an_interpreter_without_the_kit_is_refused_and_forced_its_import_error_is_in_the_logs(project):
    bare = project / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = f"python={bare / 'bin' / 'python'}"
    refused = kit(project, "submit", "script.py", "--cluster", "local", python, "--", "--steps", "5")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "cannot import the kit (ModuleNotFoundError: No module named" in refused.stderr
    assert "docs/your-own-environment.md" in refused.stderr and not (project / "runs" / "script").exists()
    forced = kit(project, "submit", "script.py", "--cluster", "local", python, "--force", "--wait", "--json")
    assert forced.returncode == 1
    first = report_of(job_of(forced, project), project)["first_failure"]
    assert first["error"].startswith("ModuleNotFoundError: No module named"), first
    assert "ModuleNotFoundError" in kit(project, "logs", str(job_of(forced, project))).stdout


def test_the_failing_step_and_the_users_own_frames_are_reported(project):
    done = kit(project, "submit", "script.py", "--cluster", "local", "--nproc-per-node", "2", "--wait", "--",
               "--steps", "200", "--fail-at", "150")  # fmt: skip
    assert done.returncode == 1
    cause = done.stdout.index("ROOT CAUSE: rank 1: ValueError: bad batch at step 150")
    assert cause < done.stdout.index(" rank  node host")  # before the table, after rank 0's followed output
    (job_dir,) = (project / "runs" / "script").iterdir()
    first = report_of(job_dir, project)["first_failure"]
    assert first["rank"] == 1 and first["step"] == 150
    text = kit(project, "logs", str(job_dir)).stdout
    assert "in step 150" in text and 'File "script.py", line' in text
    assert "shim.py" not in text and ".snapshots" not in text
    assert "shim.py" in kit(project, "logs", str(job_dir), "--verbose").stdout
