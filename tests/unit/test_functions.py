"""Python functions as jobs (``cluster.submit(fn)``): the spec of a function's job, the request
mapped onto submitit's parameters, and real local runs (slow). SLURM's runs are in
test_slurm.py, docker's in test_docker_jobs.py."""

import json
import pickle
import threading
import traceback

import pytest
from submitit.helpers import DelayedSubmission

import cluster
from cluster.api import override_texts
from cluster.backends.slurm.functions import parameters
from cluster.jobdir import FUNCTION_PICKLE
from cluster.submission import function_spec, make_submission
from fixtures.synthetic import make_job

TWO_BY_TWO = {"nodes": 2, "tasks_per_node": 2, "gpus_per_node": 2, "mem": "8G", "time": "00:10:00"}


def test_a_functions_job_on_slurm_goes_through_submitit_with_the_kits_request(tmp_path):
    spec, plan = function_spec("jobs/multi_node.yaml", override_texts(values={**TWO_BY_TWO, "log_dir": str(tmp_path), "partition": "debug",
                               "account": "lab", "qos": "high", "constraint": "a100", "exclusive": True,
                               "setup": ["module load cuda"], "env": {"NCCL_DEBUG": "WARN"}}))  # fmt: skip
    assert spec.cluster == "submitit" and spec.program.kind == "submitit" and not spec.program.require_progress
    job = make_submission(spec, plan)
    found = parameters(job)
    # A function's ranks see their node's GPUs (as submitit's own gpus_per_node and torchrun show them).
    assert {k: found[k] for k in ("job_name", "nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node", "mem",
                                  "partition", "account", "qos", "constraint", "exclusive", "time")} == {
        "job_name": "multi-node", "nodes": 2, "ntasks_per_node": 2, "cpus_per_task": spec.cpus_per_task,
        "gpus_per_node": 2, "mem": "8G", "partition": "debug", "account": "lab", "qos": "high",
        "constraint": "a100", "exclusive": True, "time": 10}  # fmt: skip
    # The spec's signal (multi_node.yaml: USR1@120) and requeue replace submitit's USR2@90.
    assert found["signal_delay_s"] == 120 and found["additional_parameters"]["signal"] == "USR1@120"
    assert found["additional_parameters"]["requeue"] is True
    assert found["additional_parameters"]["output"] == f"{tmp_path}/multi-node/slurm-%j.log"
    assert found["srun_args"] == ["--kill-on-bad-exit=1"]
    assert found["setup"][:2] == ["export NCCL_DEBUG=WARN", "module load cuda"]
    script = cluster.dry_run(print, spec="jobs/multi_node.yaml", overrides={**TWO_BY_TWO, "log_dir": str(tmp_path)})
    assert "#SBATCH --signal=USR1@120" in script and "USR2" not in script
    assert "export SUBMITIT_EXECUTOR=slurm" in script  # submitit's own script
    shim = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "-m train.rank.shim" in shim and "--rank-log" in shim and "--requeue-on-signal" in shim
    assert shim.endswith(f"-- -u -m submitit.core._submit {tmp_path}/multi-node/%j/submitit")
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_a_functions_job_has_submitits_signal_where_the_spec_has_none_and_runs_where_the_spec_says(tmp_path):
    spec, _ = function_spec(None, [f"log_dir={tmp_path}"])
    assert (spec.cluster, spec.signal, spec.requeue) == ("submitit", "USR2@90", False)
    assert "--requeue-on-signal" not in cluster.dry_run(
        print, overrides={"log_dir": str(tmp_path)}
    )  # no requeue: it runs on
    spec, _ = function_spec("jobs/local.yaml", ["tasks_per_node=3"])
    assert spec.cluster == "local" and spec.world_size == 3


def test_a_function_that_restarts_inside_its_allocation_runs_in_the_kits_own_script(tmp_path):
    spec, plan = function_spec("jobs/multi_node.yaml", ["restarts=2", "spare_nodes=1", f"log_dir={tmp_path}"])
    assert spec.cluster == "slurm"  # submitit's script has no attempts loop
    job = make_submission(spec, plan, function=DelayedSubmission(print, 1))
    assert "--submitit=$JOB_DIR/submitit" in job.script and "cluster.backends.slurm.attempts" in job.script
    assert pickle.loads(job.files[FUNCTION_PICKLE]).args == (1,)  # written by the kit after sbatch


def test_only_a_functions_job_has_a_result(tmp_path):
    job_dir = make_job(tmp_path / "train" / "123", world=2, tasks_per_node=2)
    plan = json.loads((job_dir / "plan.json").read_text())
    (job_dir / "plan.json").write_text(json.dumps({**plan, "cluster": "local"}))  # a job of the trainer
    with pytest.raises(cluster.ConfigError, match="not a function's job"):
        cluster.Job.attach(job_dir).result()


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"parallel.tp": 3, "tasks_per_node": 4}, None),  # the trainer's sections do not matter to a function
        ({"cluster": "local", "restarts": 2}, "restarts"),
        ({"program.launcher": "torchrun"}, "program.launcher"),
        ({"nodes": 0}, "nodes"),
        ({"no_such_key": 1}, "no_such_key"),
    ],
)
def test_a_functions_bad_overrides_raise_naming_the_key_and_submit_nothing(overrides, key, tmp_path):
    def fn():
        return 1

    if key is None:
        assert "srun" in cluster.dry_run(fn, spec="jobs/multi_node.yaml", log_dir=str(tmp_path), **overrides)
        return
    with pytest.raises(cluster.ConfigError) as raised:
        cluster.submit(fn, spec="jobs/multi_node.yaml", log_dir=str(tmp_path), **overrides)
    assert raised.value.key == key
    assert not tmp_path.joinpath("multi-node").exists()


def test_a_functions_sweep_validates_every_point_before_anything_runs(tmp_path):
    def fn(lr):
        return lr

    local = {"cluster": "local", "log_dir": str(tmp_path)}
    with pytest.raises(cluster.ConfigError) as raised:
        cluster.sweep(fn, grid={"lr": [0.1], "nodes": [1, 0]}, **local)
    assert raised.value.key == "nodes" and "point 1: lr=0.1 nodes=0" in str(raised.value)
    with pytest.raises(cluster.ConfigError) as raised:
        cluster.sweep(fn, grid={"learning_rate": [0.1, 1]}, **local)  # neither fn's nor the spec's
    assert raised.value.key == "learning_rate"
    assert not list(tmp_path.iterdir())


LOCK = threading.Lock()


def add(x):
    return x + 1


@pytest.mark.parametrize(
    "call, key, words",
    [
        (lambda **local: cluster.submit(add, **local), "add()", "missing a required argument: 'x'"),
        (lambda **local: cluster.submit(add, 1, 2, **local), "add()", "too many positional arguments"),
        (lambda **local: cluster.submit(add, 1, yy=2, **local), "yy",
         "neither a parameter of add() (x) nor a key of the job spec"),
        (lambda **local: cluster.submit(add, xx=2, **local), "xx", "(did you mean 'x'?)"),
        (lambda **local: cluster.submit(add, 1, nodez=2, **local), "nodez", "(did you mean 'nodes'?)"),
        (lambda **local: cluster.submit(lambda: LOCK.locked(), **local), "LOCK",
         "the global 'LOCK' that <lambda>.<locals>.<lambda>() uses cannot travel to the ranks"),
        (lambda **local: cluster.submit(add, LOCK, **local), "x", "add()'s argument 'x' cannot travel"),
        (lambda **local: cluster.dry_run(add, **local), "add()", "missing a required argument: 'x'"),
        (lambda **local: cluster.sweep(add, grid={"nodes": [1]}, **local), "add()", "missing a required argument"),
        (lambda **local: cluster.sweep(add, grid={"x": [1], "yy": [2]}, **local), "yy", "neither a parameter of add()"),
        (lambda **local: cluster.sweep("jobs/local.yaml", grid={"optim.lr": 0.1}, **local), "optim.lr",
         "a grid takes a list of values, got float 0.1"),
    ],
)  # fmt: skip
def test_a_functions_call_is_checked_before_anything_is_written(call, key, words, tmp_path):
    """Bound to the function's signature, keywords that are neither its parameters nor the
    spec's keys, what cannot be pickled, a grid that is no list: a ConfigError naming it, and
    nothing under the log root."""
    with pytest.raises(cluster.ConfigError) as raised:
        call(spec="jobs/local.yaml", log_dir=str(tmp_path))
    assert raised.value.key == key and words in str(raised.value), str(raised.value)
    assert not list(tmp_path.iterdir())


def test_a_function_shipped_by_value_names_its_real_file_and_line_in_a_ranks_traceback(tmp_path):
    """cloudpickle names the code of a function of ``__main__`` "<dynamic-code>"; on the rank
    (``train.rank.function_program``) the file it was written in comes back, with its source line."""
    import cloudpickle

    from train.rank.function_program import name_code

    source = tmp_path / "notebook.py"
    source.write_text("def helper():\n    raise ValueError('from the helper')\n\n\ndef boom():\n    helper()\n")
    scope = {"__name__": "__main__"}
    exec(compile(source.read_text(), str(source), "exec"), scope)
    shipped = cloudpickle.loads(cloudpickle.dumps(scope["boom"]))
    assert shipped.__code__.co_filename == "<dynamic-code>"
    name_code(shipped, str(source))
    with pytest.raises(ValueError) as raised:
        shipped()
    text = "".join(traceback.format_exception(raised.value))
    assert f'File "{source}", line 6, in boom\n    helper()' in text
    assert f'File "{source}", line 2, in helper\n    raise ValueError' in text


def test_a_functions_own_nodes_is_its_own_and_the_specs_go_in_overrides(tmp_path):
    """Issue 72: a function with a ``nodes`` parameter gets its own ``nodes``; the spec's nodes
    come from ``overrides`` alone (as submitit keeps ``update_parameters`` apart), silently."""
    import warnings

    from cluster.api.function_call import packed, split_call
    from cluster.submission import function_spec

    def place(nodes, rank=0):
        return nodes, rank

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the explicit form warns of nothing
        arguments, spec_values = split_call(place, {"nodes": 4}, {"nodes": 2, "cluster": "local"})
        assert arguments == {"nodes": 4} and spec_values == {"nodes": 2, "cluster": "local"}
        assert packed(place, (), arguments).kwargs == {"nodes": 4}
        spec, plan = function_spec(None, [f"{k}={v}" for k, v in spec_values.items()] + [f"log_dir={tmp_path}"])
        assert spec.nodes == 2 and plan.nodes == 2
        assert "srun" in cluster.dry_run(place, nodes=4, spec="jobs/multi_node.yaml",
                                         overrides={"nodes": 1, "log_dir": str(tmp_path)})  # fmt: skip


def test_the_old_call_still_works_for_a_release_and_warns_where_it_may_be_misread():
    from cluster.api.function_call import split_call

    def place(nodes, rank=0):
        return nodes, rank

    with pytest.warns(FutureWarning, match="nodes: .*place.*own argument, also a key of the job spec"):
        assert split_call(place, {"nodes": 4}, None) == ({"nodes": 4}, {})
    with pytest.warns(FutureWarning, match="time: read as the job spec.s, not .*place"):
        assert split_call(place, {"rank": 1, "time": "00:05:00"}, None) == ({"rank": 1}, {"time": "00:05:00"})
