"""Plan and render are pure functions: table tests, golden scripts, and the bad-spec table."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from cluster.plan import make_plan
from cluster.render import render
from cluster.request import make_request
from cluster.spec import JobSpec
from cluster.submission import load_spec
from tests.conftest import ROOT, run_module
from tests.support.bad_specs import BAD
from train.contract.config import load
from train.contract.errors import ConfigError

JOBS = sorted((ROOT / "jobs").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden"
PYTHON = "/opt/venv/bin/python"  # a fixed interpreter path, so goldens do not depend on this machine


def spec(*overrides, path=None):
    return load(JobSpec, path, list(overrides))


@pytest.mark.parametrize(
    "overrides, world, rank13",
    [
        (["nodes=4", "gpus_per_node=4"], 16, dict(node=3, local_rank=1, gpus=(1,), visible_devices="1", device="cuda:0")),
        (["nodes=2", "gpus_per_node=8"], 16, dict(node=1, local_rank=5, gpus=(5,), visible_devices="5")),
        (["nodes=2", "gpus_per_node=8", "gpu_binding=shared"], 16,
         dict(node=1, local_rank=5, visible_devices="0,1,2,3,4,5,6,7", device="cuda:5")),
        (["nodes=4", "gpus_per_node=8", "tasks_per_node=4"], 16, dict(node=3, local_rank=1, gpus=(2, 3), visible_devices="2,3")),
        (["nodes=7", "tasks_per_node=2"], 14, dict(node=6, local_rank=1, gpus=(), visible_devices="", device="cpu")),
        # A program of your own sees its node's GPUs, as torchrun's workers do: its cuda:<LOCAL_RANK> exists.
        (["nodes=2", "gpus_per_node=8", "program.script=jobs/train_cnn.py"], 16,
         dict(node=1, local_rank=5, gpus=(5,), visible_devices="0,1,2,3,4,5,6,7", device="cuda:5")),
        (["nodes=2", "gpus_per_node=8", "program.script=jobs/train_cnn.py", "gpu_binding=per_task"], 16,
         dict(node=1, local_rank=5, gpus=(5,), visible_devices="5", device="cuda:0")),
        (["nodes=2", "gpus_per_node=8", "parallel.strategy=tp", "parallel.tp=4"], 16,
         dict(node=1, coords={"pp": 0, "dp": 3, "tp": 1})),
    ],
)  # fmt: skip
def test_rank_map(overrides, world, rank13):
    strategy = [] if "parallel.strategy=tp" in overrides else ["parallel.strategy=ddp"]
    trainer = [*strategy, "train.batch_size=1680"]  # divisible by 14 and 16
    program = any(o.startswith("program.") for o in overrides)  # the trainer's sections are refused with it
    plan = make_plan(spec(*overrides, *([] if program else trainer)))
    assert plan.world_size == world == len(plan.ranks)
    slot = plan.ranks[13]
    assert {k: getattr(slot, k) for k in rank13} == rank13
    assert len({(r.node, r.local_rank) for r in plan.ranks}) == world


def test_tensor_groups_stay_inside_nodes():
    plan = make_plan(spec("nodes=3", "gpus_per_node=4", "parallel.strategy=tp", "parallel.tp=2", "train.batch_size=60"))
    groups = {}
    for r in plan.ranks:
        groups.setdefault((r.coords["pp"], r.coords["dp"]), set()).add(r.node)
    assert all(len(nodes) == 1 for nodes in groups.values())


def test_plan_of_1024_nodes():
    """Correctness only: how fast it is belongs to the benchmark (make bench, "plan")."""
    plan = make_plan(spec("nodes=1024", "gpus_per_node=8", "parallel.strategy=ddp", "train.batch_size=65536"))
    data = json.loads(json.dumps(plan.to_json()))
    assert plan.world_size == 8192 == len(data["ranks"])
    assert data["ranks"][8191] | {"node": 1023, "local_rank": 7, "gpu": 7} == data["ranks"][8191]


def test_plan_cli_json_1024_nodes():
    result = run_module("cluster", "plan", "jobs/multi_node.yaml", "nodes=1024", "gpus_per_node=8",
                        "train.batch_size=65536", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["ranks"]) == 8192


@pytest.mark.parametrize("overrides, key", BAD, ids=[k for _, k in BAD])
def test_bad_spec_names_the_key(overrides, key):
    """As a submission loads a spec: its schema, the backend's limits (cluster.checks), its plan."""
    with pytest.raises(ConfigError) as err:
        load_spec(ROOT / "jobs" / "multi_node.yaml", list(overrides), say=lambda text: None)
    assert err.value.key == key, str(err.value)


@pytest.mark.parametrize(
    "text, key",
    [("", "empty"), ("- 1\n- 2\n", "mapping"), ("nodes: [\n", "not valid YAML"), ("nodes: 2\nnodez: 3\n", "nodez")],
)
def test_bad_spec_files(tmp_path, text, key):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key):
        spec(path=path)


@pytest.mark.parametrize("command", ["plan", "render", "submit"])
def test_cli_bad_spec_exits_2(command, tmp_path):
    result = run_module("cluster", command, "jobs/local.yaml", "nodes=0", f"log_dir={tmp_path}")
    assert result.returncode == 2 and "nodes" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing submitted, nothing written


def test_cli_missing_file_exits_2():
    result = run_module("cluster", "plan", "jobs/nope.yaml")
    assert result.returncode == 2 and "jobs/nope.yaml" in result.stderr


def test_cli_binary_spec_exits_2_with_one_line(tmp_path):
    binary = tmp_path / "job.yaml"
    binary.write_bytes(bytes(range(256)) * 8)
    result = run_module("cluster", "submit", str(binary), f"log_dir={tmp_path / 'runs'}")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: {binary}: not a text file (not UTF-8): expected a YAML job spec or config"
    ]
    assert not (tmp_path / "runs").exists()


def golden_cases():
    cases = [(p.stem, p, []) for p in JOBS]
    cases += [
        ("multi_node-pyxis", ROOT / "jobs/multi_node.yaml",
         ["container.runtime=pyxis", "container.image=registry.example/kit:latest", "container.mounts=[\"/data:/data\"]"]),
        ("multi_node-apptainer", ROOT / "jobs/multi_node.yaml",
         ["container.runtime=apptainer", "container.image=/images/kit.sif", "container.mounts=[\"/data:/data\"]"]),
        ("cnn-torchrun", ROOT / "jobs/cnn.yaml", ["program.launcher=torchrun"]),
        ("multi_node-restarts", ROOT / "jobs/multi_node.yaml", ["restarts=3", "spare_nodes=1", "min_nodes=1",
                                                                   "train.ckpt_every=50"]),
        ("cnn-torchrun-restarts", ROOT / "jobs/cnn.yaml", ["program.launcher=torchrun", "restarts=2", "preflight=true"]),
        ("cnn-module", ROOT / "jobs/cnn.yaml", ["program.script=", "program.module=json.tool", "program.args=[]",
                                                 "program.require_progress=false", "preflight=true"]),
    ]  # fmt: skip
    return cases


@pytest.mark.parametrize("name, path, overrides", golden_cases(), ids=[c[0] for c in golden_cases()])
def test_render_matches_golden(name, path, overrides, request):
    s = spec(*overrides, path=path)
    plan = make_plan(s)
    python = PYTHON if s.container.runtime == "none" else "python"
    text = render(s, plan, make_request(s, plan, python), source=f"jobs/{path.name}")
    golden = GOLDEN / f"{name}.sbatch"
    if request.config.getoption("--update-golden"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendered script changed; if intended: pytest {__file__} --update-golden"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_the_batch_script_writes_its_files_whole():
    """Each launch (a requeue too) rewrites plan.json while `cluster logs` or `status` may read
    it: every file a script writes goes to a temporary name first and is renamed into place."""
    for golden in GOLDEN.glob("*.sbatch"):
        text = golden.read_text()
        written = re.findall(r"""^cat > "\$JOB_DIR/([^"]+)" <<'(\w+)'$""", text, re.M)
        assert "plan.json.tmp" in {name for name, _ in written}, golden.name
        for name, tag in written:
            assert name.endswith(".tmp") and f'\n{tag}\nmv -f "$JOB_DIR/{name}" "$JOB_DIR/{name[:-4]}"\n' in text


def test_rendered_script_essentials():
    text = (GOLDEN / "multi_node.sbatch").read_text()
    for needle in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-task=1",
                   "srun", "--kill-on-bad-exit=1", "rank_%5t", "train.run_dir=$JOB_DIR", "#SBATCH --signal=USR1@120"]:  # fmt: skip
        assert needle in text, needle
    assert "--container-image=registry.example/kit:latest" in (GOLDEN / "multi_node-pyxis.sbatch").read_text()
    assert (
        "apptainer exec --nv --bind=/data:/data /images/kit.sif python -P -m train"
        in (GOLDEN / "multi_node-apptainer.sbatch").read_text()
    )


@pytest.mark.parametrize(
    "overrides, warm",
    [
        (["restarts=2"], True),
        (["restarts=2", "warm_restarts=false"], False),
        (["restarts=2", "program.script=jobs/train_cnn.py", "program.launcher=torchrun"], False),  # fresh workers
        ([], False),  # no restarts: nothing to start warm
    ],
)
def test_the_ranks_of_a_restart_start_from_each_nodes_standby(overrides, warm):
    s = spec(*overrides, path=ROOT / "jobs/multi_node.yaml")
    plan = make_plan(s)
    text = render(s, plan, make_request(s, plan, PYTHON))
    assert ("train.rank.standby serve &" in text) == warm and ("-m train.rank.standby run -- " in text) == warm
    if warm:  # every node, the spares too, one task each with the node's CPUs and GPUs
        assert '"--nodes=$SLURM_JOB_NUM_NODES" "--ntasks=$SLURM_JOB_NUM_NODES" --ntasks-per-node=1' in text
        assert "--cpus-per-task=32 --gpus-per-node=4" in text


def test_render_cli_container_forms_and_the_batch_log_directory(tmp_path):
    for runtime, needle in [("pyxis", "--container-image=IMG"), ("apptainer", "apptainer exec --nv")]:
        result = run_module("cluster", "render", "jobs/multi_node.yaml", f"container.runtime={runtime}",
                            "container.image=IMG", f"log_dir={tmp_path}")  # fmt: skip
        assert result.returncode == 0 and needle in result.stdout
    # sbatch cannot open --output in a missing directory (the job dies at launch): render makes it.
    assert (tmp_path / "multi-node").is_dir()


def test_dry_run_prints_plan_and_script(tmp_path):
    result = run_module("cluster", "submit", "jobs/multi_node.yaml", "--dry-run", f"log_dir={tmp_path}")
    assert result.returncode == 0 and "rank" in result.stdout and "#SBATCH --nodes=2" in result.stdout
    assert not any(Path(tmp_path).iterdir())


@pytest.mark.parametrize(
    "overrides, counts, why",
    [
        (
            ["nodes=4", "tasks_per_node=4", "parallel.strategy=ddp", "train.batch_size=64"],
            [2, 1],
            "",
        ),  # 12 ranks do not split 64
        (["nodes=4", "tasks_per_node=4", "parallel.strategy=ddp", "train.batch_size=48"], [3, 2, 1], ""),
        (["nodes=3", "tasks_per_node=2", "parallel.strategy=zero1"], [], "same ranks only"),
        (["nodes=3", "tasks_per_node=2", "program.script=jobs/train_cnn.py"], [], "its own"),
    ],
)
def test_plan_says_on_which_fewer_nodes_checkpoints_resume(overrides, counts, why):
    from cluster.plan import fewer_nodes

    smaller, reason = fewer_nodes(spec("cluster=slurm", "gpus_per_node=0", *overrides))
    assert smaller == counts and why in reason


@pytest.mark.parametrize(
    "override, key", [("program.function=os:no_such_fn", "program.function"), ("signal=USR9@60", "signal")]
)
def test_submit_dry_run_of_a_bad_function_or_signal_exits_2(override, key, tmp_path):
    result = run_module("cluster", "submit", "jobs/local.yaml", override, f"log_dir={tmp_path}", "--dry-run")
    assert result.returncode == 2 and key in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_the_backend_is_chosen_once_and_its_traits_travel_with_the_plan(monkeypatch):
    """make_plan asks the registry; the request and the script ask the plan, never the
    registry again. Backend is abstract, arrays a capability some backends have."""
    import cluster.backends as registry
    from cluster.backends.base import Arrays, Backend
    from cluster.submission import load_spec, make_submission

    spec, plan = load_spec(ROOT / "jobs/multi_node.yaml", ["restarts=1"])
    assert plan.backend == registry.get("slurm").traits and plan.backend.restarts
    arrays = [isinstance(registry.get(name), Arrays) for name in ("slurm", "local", "docker", "submitit")]
    assert arrays == [True, False, False, False]
    asked = []
    monkeypatch.setattr(registry, "get", lambda name: asked.append(name))
    assert "cluster.backends.slurm.attempts" in make_submission(spec, plan).script and asked == []
    with pytest.raises(TypeError, match="abstract"):
        type("Half", (Backend,), {"name": "half"})()
