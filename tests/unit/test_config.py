import pytest

from train.contract.config import Config, apply_overrides, build, describe, load
from train.contract.errors import ConfigError


def test_defaults_are_the_exercise():
    cfg = Config()
    assert (cfg.model.n_layers, cfg.model.dim_in, cfg.model.dim_hidden, cfg.model.n_classes) == (4, 1024, 256, 32)
    assert (cfg.train.batch_size, cfg.optim.lr, cfg.train.steps, cfg.data.train_size) == (64, 0.1, 1000, 10000)
    assert cfg.data.test_size >= 1000


@pytest.mark.parametrize(
    "override, check",
    [
        ("optim.lr=0.05", lambda c: c.optim.lr == 0.05),
        ("optim.lr=1e-3", lambda c: c.optim.lr == 1e-3),  # YAML 1.1 reads this as a string
        ("optim.lr=1", lambda c: c.optim.lr == 1.0 and isinstance(c.optim.lr, float)),
        ("train.steps=7", lambda c: c.train.steps == 7),
        ("train.check_sync=true", lambda c: c.train.check_sync is True),
        ("train.fail_at_step=null", lambda c: c.train.fail_at_step is None),
        ("train.run_dir=123", lambda c: c.train.run_dir == "123"),
        ("parallel.strategy=ddp", lambda c: c.parallel.strategy == "ddp"),
        ("parallel.tp=2", lambda c: c.parallel.tp == 2),
    ],
)
def test_override_sets_typed_value(override, check):
    assert check(load(Config, None, [override]))


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("train.setps=5", "train.setps", "did you mean 'train.steps'"),
        ("trian.steps=5", "trian", "did you mean 'train'"),
        ("train.steps=abc", "train.steps", "expected int"),
        ("train.steps=1.5", "train.steps", "expected int"),
        ("train.steps=true", "train.steps", "expected int"),
        ("train.check_sync=3", "train.check_sync", "expected bool"),
        ("optim.lr=fast", "optim.lr", "expected float"),
        ("train.precision=fp8", "train.precision", "must be one of"),
        ("parallel.strategy=fsd", "parallel.strategy", "did you mean 'fsdp'"),
        ("train.steps=0", "train.steps", ">= 1"),
        ("optim.lr=-1", "optim.lr", ">= 0"),
        ("model=3", "model", "expected a mapping"),
        ("train.steps.x=3", "train.steps", "expected int"),
        ("train.steps", "train.steps", "malformed override"),
        ("=3", "=3", "malformed override"),
        ("train.steps=[1", "train.steps", "not valid YAML"),
        ("optim.lr=nan", "optim.lr", "finite"),
        ("optim.lr=.nan", "optim.lr", "finite"),
        ("optim.momentum=.inf", "optim.momentum", "finite"),
        ("train.timeout_s=-inf", "train.timeout_s", "finite"),
        ("data.separation=1e400", "data.separation", "finite"),
        ("parallel.average_every=0", "parallel.average_every", ">= 1"),
        ("optim.name=adamw", "optim.name", "did you mean 'adam'"),
    ],
)
def test_bad_override_names_the_key(override, key, words):
    with pytest.raises(ConfigError) as err:
        load(Config, None, [override])
    assert err.value.key == key
    assert words in str(err.value)


def test_yaml_file_and_overrides_compose(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.2\ntrain:\n  steps: 10\n")
    cfg = load(Config, path, ["train.steps=20"])
    assert (cfg.optim.lr, cfg.train.steps) == (0.2, 20)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "file is empty"),
        ("- a\n- b\n", "must be a mapping"),
        ("a: [", "not valid YAML"),
        ("model: 3\n", "expected a mapping"),
    ],
)
def test_bad_files(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        load(Config, path)


def test_binary_file_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a text file") as err:
        load(Config, path)
    assert err.value.key == str(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(Config, tmp_path / "nope.yaml")
    assert err.value.key.endswith("nope.yaml")


def test_overrides_build_nested_tree():
    assert apply_overrides({}, ["a.b=1", "a.c=x"]) == {"a": {"b": 1, "c": "x"}}


def test_override_below_a_value_is_rejected():
    with pytest.raises(ConfigError, match="is a value"):
        apply_overrides({"train": {"steps": 3}}, ["train.steps.x=1"])


def test_build_rejects_non_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        build(Config, [1, 2])


def test_describe_lists_every_leaf():
    keys = [k for k, _, _ in describe(Config)]
    assert "optim.lr" in keys and "parallel.strategy" in keys and "model" not in keys


def test_adam_refuses_a_momentum_it_would_ignore():
    with pytest.raises(ConfigError) as err:
        load(Config, None, ["optim.name=adam", "optim.momentum=0.9"])
    assert err.value.key == "optim.momentum" and "adam" in str(err.value)


@pytest.mark.parametrize("strategy", ["tp", "pipeline"])
def test_a_strategy_that_splits_the_model_is_refused_on_one_rank(strategy):
    """One rank has nothing to split: a clear error naming the key, not a crash in torch."""
    from train.contract.mesh import resolve_dims
    from train.contract.strategies import needs_process_group

    cfg = load(Config, None, [f"parallel.strategy={strategy}"])
    with pytest.raises(ConfigError) as err:
        resolve_dims(cfg.parallel, cfg.model, world_size=1, ranks_per_node=1)
    assert err.value.key == "parallel.strategy" and "one rank has nothing to split" in str(err.value)
    # The others run on one rank through a process group of one; only these two need none.
    assert [s for s in ("single", "model_parallel", "ddp", "fsdp") if not needs_process_group(s, 1)] == [
        "single", "model_parallel"]  # fmt: skip


def test_fsdp_with_tp_over_the_whole_world_is_refused_naming_parallel_tp():
    """2 ranks, tp=2: no data-parallel rank is left for FSDP (it crashed in torch's mesh lookup)."""
    from train.contract.mesh import resolve_dims

    cfg = load(Config, None, ["parallel.strategy=fsdp", "parallel.tp=2"])
    with pytest.raises(ConfigError) as err:
        resolve_dims(cfg.parallel, cfg.model, world_size=2, ranks_per_node=2)
    assert err.value.key == "parallel.tp" and "nothing to shard over" in str(err.value)
    assert resolve_dims(cfg.parallel, cfg.model, world_size=4, ranks_per_node=4).dp_shard == 2


def test_the_trainers_watch_keys_are_the_users_where_the_job_spec_sets_none():
    """train.stall_timeout_s and train.preempt_signal go to the ranks unless the job spec sets its
    own stall_timeout_s or signal (then they are refused: tests/support/bad_specs.py)."""
    from cluster.spec import JobSpec

    spec = load(JobSpec, "jobs/local.yaml", ["train.stall_timeout_s=30", "train.preempt_signal=USR2"])
    train = spec.train_config().train
    assert (train.stall_timeout_s, train.preempt_signal, train.checkpoint_dir) == (30, "USR2", "")
    spec = load(JobSpec, "jobs/local.yaml", ["checkpoint_dir=/scratch/run1"])
    assert spec.train_config().train.checkpoints.as_posix() == "/scratch/run1"


def test_a_programs_arguments_are_a_list_or_one_string_split_as_a_shell_would():
    from cluster.spec import JobSpec

    for given, words in ((["--steps", "10"], ["--steps", "10"]), ("--steps 10 --name 'a b'", ["--steps", "10", "--name", "a b"]),
                         ("", [])):  # fmt: skip
        assert build(JobSpec, {"program": {"script": "x.py", "args": given}}).program.args == words
    with pytest.raises(ConfigError, match=r"program.args.*expected a list.*YAML: \[a, b\]"):
        build(JobSpec, {"program": {"script": "x.py", "args": 10}})
