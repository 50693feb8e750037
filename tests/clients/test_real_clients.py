"""The real-client tier: programs written for torchrun by nobody here (Hugging Face's
``transformers.Trainer``, PyTorch Lightning's ``Trainer``, a raw Accelerate loop, a tqdm
script, a script that uses its standard streams as training scripts do) through the kit,
unchanged, in both launch modes: they
train, and when they crash or hang, ``cluster logs`` names the rank, its error or the line it
sleeps on, and its step. (Lightning's own requeue at SLURM's signal: the SLURM tier.)

The jobs of this module run side by side (a pool of three), once, in a module fixture: a hang
costs its stall timeout in waiting, not in CPU."""

import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cluster.system.poll import wait_until
from tests.conftest import ROOT, run_module, torchrun
from tests.support.jobs import (
    cancel,
    job_running,
    logs_json,
    submit,
    wait_for_line,
    wait_for_step,
    wait_leftovers_ended,
    wait_nothing_left,
)
from train.contract.protocol import LEFTOVERS, STAMPED
from train.rank.output import STAMPER_GONE

pytestmark = pytest.mark.clients

CLIENTS = ROOT / "tests" / "support" / "clients"
LAUNCHERS = ("per_task", "torchrun")
# Each client's script is {client}_train.py. A crash is the script's own exception, whoever wrote
# the loop (a raw Accelerate loop's and HF Trainer's here: tqdm's trains and hangs); a hang is
# caught where each client's loop waits, so Lightning's is there too.
CRASHING, HANGING = ("accelerate", "hf"), ("tqdm", "hf", "lightning")
STALL_S = 8  # the watchdog fires 8 to 10 s after the last step
BASE = ["tasks_per_node=2", f"stall_timeout_s={STALL_S}"]
FAULTS = {  # a crash on rank 1, a hang on rank 0, whose tqdm bar is open when its watchdog fires
    "trains": [],
    "crash": ["--crash-at", "10", "--crash-rank", "1"],
    "hang": ["--hang-at", "10", "--hang-rank", "0"],
}
# Where rank 0 is found when it hangs: on its own sleep, or (tqdm's) in its loop, waiting for the
# batch that its DataLoader's worker never returns (that worker sleeps in the data set).
HANG_LINE = {"tqdm": "the loop waits here for a batch", "hf": "time.sleep(3600)", "lightning": "time.sleep(3600)"}


def client_job(script: str, launcher: str, args: list[str]) -> list[str]:
    return [f"program.script={CLIENTS / script}", f"program.args={json.dumps(args)}", f"program.launcher={launcher}"]


def line_of(script: str, text: str) -> int:
    return next(i for i, line in enumerate((CLIENTS / script).read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every scenario's finished job: (submit's exit code, its job directory, cluster logs --json)."""
    root = tmp_path_factory.mktemp("clients")
    runs = {}
    for launcher in LAUNCHERS:
        for fault, args in FAULTS.items():
            client = "accelerate" if fault == "crash" else "tqdm"
            runs[(client, fault, launcher)] = client_job(f"{client}_train.py", launcher, ["--steps", "30", *args])
            if fault != "crash":
                out = str(root / f"lightning-{fault}-{launcher}")
                runs[("lightning", fault, launcher)] = client_job(
                    "lightning_train.py", launcher, ["--output-dir", out, *args]
                )
            if fault != "trains":  # Hugging Face's training runs are the sweep's points
                out = str(root / f"hf-{fault}-{launcher}")
                runs[("hf", fault, launcher)] = client_job("hf_train.py", launcher, ["--output-dir", out, *args])

    def run(key):
        result, info = submit("jobs/local.yaml", root / "-".join(key), *BASE, *runs[key], timeout=600)
        assert info is not None, result.stdout + result.stderr
        return key, (result.returncode, Path(info["log_dir"]), logs_json(Path(info["log_dir"]))[1])

    def hf_sweep():
        points = root / "points.yaml"
        points.write_text(json.dumps([{"program.launcher": launcher, "program.args": ["--lr", lr, "--output-dir",
                                       str(root / f"hf-{lr}")]} for launcher, lr in zip(LAUNCHERS, ("1e-3", "5e-4"))]))  # fmt: skip
        done = run_module("cluster", "sweep", "jobs/local.yaml", f"program.script={CLIENTS / 'hf_train.py'}", *BASE,
                          f"log_dir={root / 'sweep'}", "--points", str(points), "--max-parallel", "2", "--wait",
                          timeout=600)  # fmt: skip
        sweep_dir = next((root / "sweep" / "local").glob("sweep-*"))
        table = json.loads(run_module("cluster", "logs", str(sweep_dir), "--json").stdout)
        return "sweep", (done.returncode, sweep_dir, table)

    def lightning_stopped():
        """Lightning's Trainer, cancelled (SIGTERM, as at a time limit) once both ranks have
        trained 10 steps and wait for it outside any collective (``--hold-at``: Lightning's own
        handler runs one, and deadlocks with a peer that the signal found inside one)."""
        args = ["--steps", "100000", "--hold-at", "10", "--output-dir", str(root / "lightning-stopped")]
        result, info = submit("jobs/local.yaml", root / "stopped", *BASE, *client_job("lightning_train.py", "per_task", args),
                              wait=False)  # fmt: skip
        assert info is not None, result.stdout + result.stderr
        job_dir = Path(info["log_dir"])
        try:
            for rank in (0, 1):
                wait_for_line(job_dir / f"rank_{rank:05d}.log", f"rank {rank}: holding at step 10", timeout=300)
        finally:
            cancel(job_dir)
        return "stopped", (None, job_dir, logs_json(job_dir)[1])

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(hf_sweep), pool.submit(lightning_stopped)] + [pool.submit(run, key) for key in runs]
        return dict(future.result() for future in futures)


def finished_at(job_dir: Path) -> float:
    """When the job's ranks last wrote (their logs and records), by the files' own clock: its end
    as the goodput ledger dates it. Not the launcher's own end after them: torchrun's agent
    took 1.2 s more to exit in a loaded CI run, 11 % of a sweep point's 10.4 s."""
    return max(path.stat().st_mtime for path in job_dir.glob("rank_*"))


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_tqdm_script_trains_with_every_line_of_its_log_stamped(jobs, launcher):
    """Its batches come from a DataLoader's two worker processes, which end with the rank."""
    code, job_dir, report = jobs[("tqdm", "trains", launcher)]
    assert code == 0 and [(r["state"], r["last_step"]) for r in report["ranks"]] == [("completed", 30)] * 2
    text = (job_dir / "rank_00000.log").read_bytes().decode()
    assert "30/30" in text and all(STAMPED.match(line) for line in text.split("\n")[:-1])
    assert LEFTOVERS not in text + (job_dir / "rank_00001.log").read_text()  # nothing left behind to end


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_lightning_trains_where_it_finds_torchruns_ranks(jobs, launcher):
    """Lightning reads the ranks from the environment (torchrun's: TorchElastic; the kit's
    per-task ranks: its own environment, from the same variables) and trains 30 steps."""
    code, job_dir, report = jobs[("lightning", "trains", launcher)]
    assert code == 0 and [(r["state"], r["last_step"]) for r in report["ranks"]] == [("completed", 30)] * 2
    for rank in (0, 1):
        text = (job_dir / f"rank_{rank:05d}.log").read_bytes().decode()
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in text and f"rank {rank}: loss=" in text
        assert all(STAMPED.match(line) for line in text.split("\n")[:-1] if line)  # its blank lines: as they are


def test_lightning_stopped_by_sigterm_is_named_so_not_completed(jobs):
    """Lightning's Trainer stops on SIGTERM (a cancel here; SLURM's at the time limit) and exits
    0: the shim notes that SIGTERM came, and ``cluster logs`` says what ended the ranks (it said
    "completed", as of a job that had finished; then "killed", a failure: it is a person's
    cancel, and exits 0). Every rank's stacks are in its log before
    Lightning's handler runs (Python's installing of that handler had taken faulthandler's away)."""
    _, job_dir, report = jobs["stopped"]
    holding = line_of("lightning_train.py", "time.sleep(0.05)")
    for rank in (0, 1):
        log = (job_dir / f"rank_{rank:05d}.log").read_text()
        dumped = log.find(f'lightning_train.py", line {holding} in on_train_batch_end')
        assert -1 < dumped < log.find(f"[rank: {rank}] Received SIGTERM"), log[-3000:]
    for rank in report["ranks"]:
        assert rank["state"] == "cancelled" and rank["last_step"] >= 10, rank
        assert (
            rank["error"]
            == "cancelled by cluster cancel (SIGTERM); its own SIGTERM handler stopped it unfinished (exit 0)"
        ), rank


@pytest.mark.parametrize("client", CRASHING)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_crash_names_the_rank_its_error_its_line_and_its_step(jobs, client, launcher):
    code, job_dir, report = jobs[(client, "crash", launcher)]
    first = report["first_failure"]
    script = f"{client}_train.py"
    assert code == 1 and first["rank"] == 1 and first["state"] == "failed", first
    if client == "accelerate":  # it found both ranks and their rendezvous in the environment
        assert "accelerate: 2 processes, DistributedType.MULTI_CPU" in (job_dir / "rank_00000.log").read_text()
    assert f"RuntimeError: {script.removesuffix('.py')}: crash at step 10 on rank 1" in first["error"]
    assert first["last_step"] == 10
    raising = line_of(script, "raise RuntimeError")
    assert any(f'{script}", line {raising}' in f and "raise RuntimeError" in f for f in first["frames"]), first
    assert report["cascade"] == {} or 0 in [r for ranks in report["cascade"].values() for r in ranks]


@pytest.mark.parametrize("client", HANGING)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_hang_names_the_stalled_rank_at_its_last_step_and_the_line_it_sleeps_on(jobs, client, launcher):
    """Rank 0 (its tqdm bar open) hangs after step 10; rank 1 waits in the next collective.
    The first failure is rank 0, stalled at step 10, on the line it hangs on, dated by its last
    step (not by the watchdog's firing, a stall timeout later); a rank whose watchdog fired
    is stalled too; the job ends within the stall timeout and a minute. Where rank 0 waits for
    its DataLoader's worker (tqdm's), that worker, stuck in the data set, would outlive the
    job: it is gone with the job."""
    code, job_dir, report = jobs[(client, "hang", launcher)]
    first = report["first_failure"]
    script = f"{client}_train.py"
    sleeping = line_of(script, HANG_LINE[client])
    if client == "tqdm":  # its DataLoader worker, stuck in the data set, is gone with the job
        wait_nothing_left(job_dir)
        if launcher == "per_task":  # ended by rank 0's stamper: the local launcher ends tasks, not their children
            wait_leftovers_ended(job_dir / "rank_00000.log")
        # Under torchrun, when rank 1's watchdog fires first, the agent ends rank 0's whole
        # process group, the worker too, before the stamper sees anything left.
    assert code == 1 and report["hang"]["culprits"] == [0], report["hang"]
    assert (first["rank"], first["state"], first["last_step"]) == (0, "stalled", 10), first
    assert f"{script}:{sleeping} in " in first["error"], first["error"]
    for rank in report["ranks"]:
        fired = "Timeout (" in Path(rank["log"]).read_text(errors="replace")
        assert rank["state"] == "stalled" if fired else rank["state"] in ("stalled", "killed"), rank
        assert rank["last_step"] == 10 and "killed by a signal?" not in (rank["error"] or ""), rank
    ended = finished_at(job_dir)
    assert first["time"] <= ended - STALL_S + 1  # dated by the hang, not by the watchdog's firing
    assert ended - first["time"] <= STALL_S * 1.25 + 60


def test_a_sweep_of_hugging_faces_trainer_reads_its_metrics_and_times_each_point(jobs):
    """Two points (a launch mode and a learning rate each): HF's own dicts give the loss
    column, the step column is HF's global_step, and the wall column each point's duration."""
    code, sweep_dir, table = jobs["sweep"]
    assert code == 0 and [r["state"] for r in table["points"]] == ["completed"] * 2, table
    for row in table["points"]:
        assert row["steps"] == 20 and isinstance(row["metrics"].get("loss"), float), row
        assert table["metric"] == "train_loss" and isinstance(row["metrics"]["train_loss"], float)
        job_dir = Path(row["job_dir"])
        submitted = min(json.loads(line)["time"] for line in (sweep_dir / "jobs.jsonl").read_text().splitlines()
                        if json.loads(line)["job_dir"] == row["job_dir"])  # fmt: skip
        real = finished_at(job_dir) - submitted
        assert abs(row["wall_s"] - real) <= 0.1 * real, (row["wall_s"], real)
    printed = run_module("cluster", "logs", str(sweep_dir)).stdout
    assert "train_loss" in printed and "loss" in printed.split("\n")[1].replace("train_loss", "")


def test_hugging_faces_loss_is_a_series_in_its_page_and_tensorboard_with_the_points_parameters(jobs):
    """Trainer prints a dict every logging_steps (5), with no step of its own: each lands at the
    optimizer step the shim counted, in the point's metrics, its page (written by the sweep's
    --wait, with the sweep's) and TensorBoard's events, with the point's learning rate as hparams."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.unit.test_page import scalars
    from train.contract.protocol import TENSORBOARD

    _, sweep_dir, table = jobs["sweep"]
    assert (sweep_dir / "page.html").exists()
    for row in table["points"]:
        job_dir = Path(row["job_dir"])
        loss = scalars(job_dir / TENSORBOARD)["metrics/loss"]
        assert [step for step, _ in loss] == [5, 10, 15, 20], loss
        assert 'id="series-loss-ranks-0"' in (job_dir / "page.html").read_text()
        acc = EventAccumulator(str(job_dir / TENSORBOARD))
        acc.Reload()
        content = b"".join(acc.PluginTagToContent("hparams").values())
        assert b"program.launcher" in content and b"program.args" in content  # the point's parameters


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_lightnings_loss_is_read_from_its_progress_bar(jobs, launcher):
    """Lightning's progress bar (rich's, where rich is installed) ends with "train_loss: ...":
    the loss column has each rank's, as printed."""
    _, job_dir, report = jobs[("lightning", "trains", launcher)]
    assert all(r["last_loss"] is not None for r in report["ranks"]), report["ranks"]


# ----------------------------------------------------------------------------- the streams
def rank_lines(text: str) -> dict[int, set[str]]:
    """What each rank printed ("rank R: ..."), wherever lines of two ranks or streams met."""
    found: dict[int, set[str]] = {}
    for m in re.finditer(r"rank (\d+): (.*?)(?=rank \d+: |[\r\n]|$)", text):
        if not m.group(2).startswith("waiting for"):
            found.setdefault(int(m.group(1)), set()).add(m.group(2))
    return found


def stamper_of(pid: int) -> int:
    """The rank's stamper process: its child running train.rank.stamper."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return next(int(c) for c in children if b"train.rank.stamper" in Path(f"/proc/{c}/cmdline").read_bytes())


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory):
    stop = tmp_path_factory.mktemp("streams") / "stop"
    stop.touch()
    done = torchrun(2, "tests.support.clients.streams", f"--stop-file={stop}")
    assert done.returncode == 0, done.stdout + done.stderr
    return rank_lines(done.stdout + done.stderr)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_standard_streams_behave_as_under_torchrun_and_a_killed_stamper_takes_no_rank_down(
    under_torchrun, launcher, tmp_path
):
    """The script reconfigures stdout, writes bytes through ``.buffer``, wraps stderr's buffer,
    prints "\\r" updates: what each rank prints is what it prints under plain torchrun, every
    line stamped. Rank 1's stamper is then SIGKILLed: the rank trains on, its log says so, and
    the job completes."""
    stop = tmp_path / "stop"
    result, info = submit("jobs/local.yaml", tmp_path, *BASE, *client_job("streams.py", launcher, ["--stop-file", str(stop)]),
                          wait=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_dir = Path(info["log_dir"])
    try:
        log = job_dir / "rank_00001.log"
        wait_for_line(log, "rank 1: waiting for", timeout=120)
        os.kill(stamper_of(wait_for_step(job_dir, 1, None)["pid"]), signal.SIGKILL)
        wait_for_line(log, STAMPER_GONE, timeout=60)
        wait_for_line(log, "rank 1: waiting for", timeout=60)  # still printing
        stop.touch()
        wait_until(lambda: not job_running(job_dir), 120, "the job to end")
    finally:
        cancel(job_dir)
    _, report = logs_json(job_dir)
    assert [r["state"] for r in report["ranks"]] == ["completed"] * 2, report["ranks"]
    texts = [(job_dir / f"rank_{r:05d}.log").read_bytes().decode() for r in range(2)]
    found = rank_lines("".join(texts))
    assert found == under_torchrun and len(found[0]) == 8, (found, under_torchrun)
    lines = texts[0].split("\n")[:-1]
    assert all(STAMPED.match(line) for line in lines), lines
    before, _, after = texts[1].partition(STAMPER_GONE)
    assert all(STAMPED.match(line) for line in before.split("\n")[:-1] if line)  # the note starts a line
    assert "rank 1: done" in after and not STAMPED.match(after.split("\n")[-2])  # unstamped from then on
