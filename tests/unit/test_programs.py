"""A user's own program under the kit: the program: section, its request, and real local jobs
of jobs/train_cnn.py (a script written for torchrun that knows nothing of the kit)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.plan import make_plan
from cluster.request import make_request
from cluster.spec import JobSpec
from cluster.submission import load_spec
from cluster.system.poll import wait_until
from tests.conftest import ROOT, run_module
from tests.support.programs import CNN
from train.contract.config import load
from train.contract.errors import ConfigError
from train.rank.shim import ProgramSignals


def spec(*overrides, path="jobs/cnn.yaml") -> JobSpec:
    return load(JobSpec, ROOT / path, list(overrides))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["program.script=nope.py"], "program.script", "no such file 'nope.py' (looked for relative to"),
        (["program.script=/nope.py"], "program.script", "no such file '/nope.py'"),
        (["program.script=jobs"], "program.script", "'jobs' is a directory, not a script"),
        (["program.script=", "program.module=no_such_module_here"], "program.module", "no module named"),
        (["program.script=", "program.function=jobs.train_cnn:nope", "program.args=[]"], "program.function", "defines no 'nope'"),
        (["program.script=", "program.function=jobs.train_cnn"], "program.function", "pkg.module:function"),
        (["program.script=", "program.command=no-such-binary"], "program.command", "not an executable"),
        (["program.module=json"], "program", "exactly one of"),
        (["program.script="], "program", "got none"),
        (['program.args=["--steps", 3]'], "program.args[1]", "expected a string"),
        (["program.args=10"], "program.args", "expected a list"),  # a string is split as a shell would
        (["program.kwargs={a: 1}"], "program.kwargs", "kwargs are for program.function"),
        (["program.script=", "program.function=jobs.train_cnn:main"], "program.args", "called with kwargs"),
        (["program.launcher=mpirun"], "program.launcher", "must be one of"),
        (["stall_timeout_s=-1"], "stall_timeout_s", ">= 0"),
        (["program.script=", "program.function=os:no_such_fn", "program.args=[]"], "program.function", "defines no 'no_such_fn'"),
        (["signal=USR9@60"], "signal", "SIGUSR9 is no signal"),
        (["signal=USR1@soon"], "signal", "whole seconds"),
        (["signal=X:USR1@60"], "signal", "B, R or RB"),
        (["signal=KILL@60"], "signal", "cannot be caught"),
    ],
)  # fmt: skip
def test_bad_program_names_the_key(overrides, key, words, monkeypatch):
    """As a submission loads a spec: the schema, then the program on disk (cluster.checks)."""
    monkeypatch.chdir(ROOT)  # program paths are relative to where `submit` runs
    with pytest.raises(ConfigError) as err:
        load_spec(ROOT / "jobs/cnn.yaml", list(overrides), say=lambda text: None)
    assert err.value.key == key and words in str(err.value)


@pytest.mark.parametrize(
    "job, overrides, key",
    [
        ("jobs/cnn.yaml", ["train.steps=5"], "train.steps"),  # a trainer key beside a program: not read
        ("jobs/cnn.yaml", ["train.stall_timeout_s=5"], "set the job spec's stall_timeout_s"),
        ("jobs/local.yaml", [CNN, "parallel.strategy=fsdp"], "parallel.strategy"),
    ],
)
def test_trainer_keys_with_a_program_exit_2_and_submit_nothing(job, overrides, key, tmp_path):
    result = run_module("cluster", "submit", job, *overrides, f"log_dir={tmp_path}")
    assert result.returncode == 2 and key in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


def test_a_trainer_spec_reused_for_a_script_says_its_sections_are_ignored():
    result = run_module("cluster", "plan", "jobs/local.yaml", CNN)
    assert result.returncode == 0 and "section(s) are the built-in trainer's and are ignored" in result.stderr


# ----------------------------------------------------------------------------- the request
@pytest.fixture
def kept(monkeypatch):
    """The shim's ProgramSignals with SIGUSR2 for the time-limit signal, in this process; after
    the test, the interpreter's own ``signal.signal`` and ``getsignal`` (ProgramSignals replaces
    them for the program), SIGUSR2's default and SIGTERM's handler as they were."""
    install, sigterm = signal.signal, signal.getsignal(signal.SIGTERM)
    for name in ("signal", "getsignal"):
        monkeypatch.setattr(signal, name, getattr(signal, name))
    yield ProgramSignals(signal.SIGUSR2)
    install(signal.SIGUSR2, signal.SIG_DFL)
    install(signal.SIGTERM, sigterm)


def test_a_kept_time_limit_signal_goes_to_the_programs_handler_once_and_never_to_a_default(kept):
    """The shim keeps the signal that came before the program's handler; at a step it passes it
    on once there is a handler, once, and not while there is none or the program ignores it."""
    got = []
    os.kill(os.getpid(), signal.SIGUSR2)
    wait_until(lambda: kept.kept, 30, "the shim's handler")
    kept.pass_on()  # the shim's own handler still: kept
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    kept.pass_on()
    assert kept.kept
    signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    kept.pass_on()
    wait_until(lambda: got, 30, "the program's handler")
    kept.pass_on()
    assert got == [signal.SIGUSR2] and not kept.kept


def test_the_program_sees_no_handler_where_the_shims_is_and_its_default_never_kills(kept):
    """As without the kit, the program sees the default disposition (Lightning installs its SLURM
    auto-requeue only where no handler is), and its own handler where it set one (the shim's
    runs it, saying that the signal came: --until-done reads that); the default it sets back is
    the shim's handler."""
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) == kept.lookup(signal.SIGUSR1)  # the other signals as they are
    got = []
    mine = lambda signum, frame: got.append(signum)  # noqa: E731
    assert signal.signal(signal.SIGUSR2, mine) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR2) is mine and kept.lookup(signal.SIGUSR2) is not mine
    os.kill(os.getpid(), signal.SIGUSR2)
    wait_until(lambda: got, 30, "the program's handler, through the shim's")
    assert signal.signal(signal.SIGUSR2, signal.SIG_DFL) is mine  # as Lightning's teardown puts it back
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL and kept.lookup(signal.SIGUSR2) == kept.came
    os.kill(os.getpid(), signal.SIGUSR2)  # the default would end this process
    wait_until(lambda: kept.kept, 30, "the shim's handler")


def test_a_sigterm_the_programs_own_handler_took_is_noted_and_the_handler_is_the_programs(kept):
    """A program that stops on SIGTERM and exits 0 (Lightning's Trainer) was stopped, not
    finished: the shim notes that SIGTERM came; the program sees and gets back its own handler."""
    got = []
    mine = lambda signum, frame: got.append(signum)  # noqa: E731
    signal.signal(signal.SIGTERM, mine)
    assert signal.getsignal(signal.SIGTERM) is mine and kept.lookup(signal.SIGTERM) is not mine
    assert not kept.terminated
    os.kill(os.getpid(), signal.SIGTERM)
    wait_until(lambda: got, 30, "the program's SIGTERM handler")
    assert got == [signal.SIGTERM] and kept.terminated
    assert signal.signal(signal.SIGTERM, signal.SIG_DFL) is mine


STACKS_THEN_HANDLER = """
import os, signal, sys, time
from train.rank.hangs import install_dumps
from train.rank.shim import ProgramSignals
install_dumps()
ProgramSignals(None)
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(print("the program's handler", flush=True)))
os.kill(os.getpid(), signal.SIGTERM)
while not got:
    time.sleep(0.01)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as Lightning's teardown puts it back
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
"""


def test_sigterm_dumps_every_stack_before_the_programs_own_handler_and_after_it_is_gone():
    """Python's ``signal.signal`` replaces faulthandler's handler below it: a program with its own
    SIGTERM handler (Lightning's Trainer) left no stacks in the log, and a rank stuck in a
    collective, which runs no Python handler, left nothing at all before its SIGKILL."""
    result = subprocess.run([sys.executable, "-c", STACKS_THEN_HANDLER], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert result.stdout == "the program's handler\n"
    assert result.stderr.count("(most recent call first):") == 2, result.stderr
    assert result.stderr.count('File "<string>", line 9 in <module>') == 1  # at the first kill, the handler's after
    assert result.stderr.count('File "<string>", line 13 in <module>') == 1, result.stderr


def test_per_task_ranks_run_the_shim_around_the_program():
    s = spec('program.args=["--steps", "7"]', "stall_timeout_s=30")
    (step,) = make_request(s, make_plan(s), "py").steps
    assert step.per_rank and step.tasks_per_node == 2 and step.log == "rank"
    assert step.command == ("py", "-P", "-m", "train.rank.shim", "--job-dir=$JOB_DIR", "--stall-timeout-s=30",
                            "--startup-timeout-s=600", "--time-limit-signal=USR1", "--script=jobs/train_cnn.py",
                            "--", "--steps", "7")  # fmt: skip
    (plain,) = make_request(spec("signal="), make_plan(spec("signal=")), "py").steps  # no signal: no handler
    assert not any(w.startswith("--time-limit-signal") for w in plain.command)


@pytest.mark.parametrize("signal, agent", [("USR1@120", "train.rank.agent"), ("", "torch.distributed.run"),
                                           ("B:USR1@120", "torch.distributed.run")])  # fmt: skip
def test_torchrun_agents_run_in_the_kits_wrapper_when_the_ranks_get_a_time_limit_signal(signal, agent):
    s = spec("program.launcher=torchrun", f"signal={signal}")
    (step,) = make_request(s, make_plan(s), "py").steps
    assert step.command[3] == agent


def test_torchrun_launcher_runs_one_agent_per_node_with_the_plans_ranks_per_node():
    s = spec("program.launcher=torchrun")
    plan = make_plan(s)
    (step,) = make_request(s, plan, "py").steps
    assert not step.per_rank and step.tasks_per_node == 1 and step.log == "node"
    assert "--nproc-per-node=2" in step.command and "--nnodes=2" in step.command
    assert "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT" in step.command and "--rank-log" in step.command
    # every worker of a node sees the node's GPUs and picks cuda:<local rank>
    assert [(r.visible_devices, r.device) for r in plan.ranks[:2]] == [("0,1", "cuda:0"), ("0,1", "cuda:1")]


def test_function_programs_get_their_kwargs_as_json():
    s = spec("program.script=", "program.function=jobs.train_cnn:main", "program.args=[]", "program.kwargs={lr: 0.1}")
    (step,) = make_request(s, make_plan(s), "py").steps
    assert "--function=jobs.train_cnn:main" in step.command and '--kwargs={"lr":0.1}' in step.command


def test_plan_shows_what_each_rank_or_agent_runs():
    per_task = run_module("cluster", "plan", "jobs/cnn.yaml")
    assert "train: each rank runs: " in per_task.stdout and "-P -m train.rank.shim" in per_task.stdout
    torchrun = json.loads(run_module("cluster", "plan", "jobs/cnn.yaml", "program.launcher=torchrun", "--json").stdout)
    assert "train.rank.agent" in torchrun["steps"][0]["command"] and torchrun["steps"][0]["tasks_per_node"] == 1


def test_dry_run_shows_the_exact_local_command(tmp_path):
    result = run_module("cluster", "submit", "jobs/local.yaml", CNN, "--dry-run", f"log_dir={tmp_path}")
    assert result.returncode == 0 and "what the local launcher would run" in result.stdout
    assert "-P -m train.rank.shim '--job-dir=$JOB_DIR'" in result.stdout and not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "script, noted", [("tests/support/user_script.py", False), ("tests/support/ckpt_killer.py", True)]
)
def test_plan_notes_a_script_that_never_names_the_specs_signal(script, noted):
    result = run_module("cluster", "plan", "jobs/cnn.yaml", f"program.script={script}")
    assert result.returncode == 0 and ("never names SIGUSR1" in result.stderr) == noted, result.stderr


@pytest.mark.parametrize("time, noted", [("00:02:00", True), ("00:02:30", False), ("00:03:00", False)])
def test_plan_notes_a_signal_slurm_may_send_before_the_ranks_start(time, noted):
    """sbatch may send --signal up to 60 s early: with USR1@90, a job of 150 s or less may get
    it at its start (minutes are rounded up, as SLURM does: 2:30 is 3 minutes, so 180 s)."""
    result = run_module("cluster", "plan", "jobs/cnn.yaml", f"time={time}", "signal=USR1@90")
    assert result.returncode == 0 and ("may send the signal up to 60 s early" in result.stderr) == noted, result.stderr


NANOGPT_LAYOUT = """# nanoGPT's layout: its train.py runs when imported (its configurator reads sys.argv)
import pathlib
pathlib.Path("IMPORTED").write_text("the user's train.py ran")
raise SystemExit("configurator: plan is not a config file")
"""


@pytest.mark.parametrize("entry", ["python -m cluster", "cluster-kit"])
def test_the_kit_never_imports_the_users_train_py_from_their_directory(tmp_path, entry):
    """From a project holding train.py, model.py and a spec (nanoGPT's own repository), the
    kit's commands import the kit's train package, not the user's: plan and a dry run work,
    and the user's train.py never runs."""
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(NANOGPT_LAYOUT)
    (tmp_path / "model.py").write_text("raise SystemExit('the user model.py ran')\n")
    (tmp_path / "spec.yaml").write_text("name: ng\ncluster: local\ntasks_per_node: 2\nprogram:\n  script: train.py\n")
    command = (
        [sys.executable, "-m", "cluster"]
        if entry.startswith("python")
        else [str(Path(sys.executable).parent / "cluster-kit")]
    )
    if not Path(command[0]).exists():
        pytest.skip(f"{command[0]} is not installed here")
    for args in (["plan", "spec.yaml"], ["submit", "spec.yaml", "--dry-run"]):
        done = subprocess.run([*command, *args], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "world size 2" in done.stdout and not (tmp_path / "IMPORTED").exists()
