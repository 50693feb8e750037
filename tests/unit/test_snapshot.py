"""The code snapshot (``cluster.provenance.snapshot``): which files, one copy per content, complete
or absent, and what the job's records say. Real git work trees in temporary directories."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.provenance import snapshot as snap
from cluster.provenance.snapshot import STORE, take
from tests.conftest import run_module
from tests.support.repos import git, make_repo
from train.contract.errors import ConfigError

SCRIPT = "import torch\nprint('version one')\n"
SPEC = "cluster: local\nprogram:\n  script: main.py\n  require_progress: false\n"


@pytest.fixture
def repo(tmp_path):
    return make_repo(
        tmp_path / "repo",
        {"main.py": SCRIPT, "lib/util.py": "X = 1\n", ".gitignore": "data/\n*.ckpt\n", "job.yaml": SPEC},
    )


def files_of(code) -> set[str]:
    return set(snap.manifest_of(code.tree))


def test_a_git_tree_is_its_tracked_files_as_on_disk_and_its_untracked_files_less_what_git_ignores(repo, tmp_path):
    (repo / "lib/util.py").write_text("X = 2\n")  # uncommitted
    (repo / "new.py").write_text("Y = 1\n")  # untracked
    (repo / "data").mkdir()
    (repo / "data/big.bin").write_bytes(b"0" * 100)  # ignored
    (repo / "model.ckpt").write_text("weights")  # ignored
    (repo / "secret.env").write_text("TOKEN=abc")  # excluded by the spec
    code = take(repo, tmp_path / "runs", exclude=("*.env",))
    assert files_of(code) == {".gitignore", "job.yaml", "lib/util.py", "new.py", "main.py"}
    assert (Path(code.tree) / "lib/util.py").read_text() == "X = 2\n"
    assert code.git["dirty"] and code.git["changed"] == ["lib/util.py", "new.py"]
    assert code.git["commit"] == git(repo, "rev-parse", "HEAD").strip() and code.git["branch"] == "main"
    assert "-X = 1\n+X = 2" in code.diff and "TOKEN" not in code.diff and "secret" not in json.dumps(code.to_json())
    assert code.kit is False and not code.notes


def test_the_same_tree_is_stored_once_and_two_trees_share_their_files(repo, tmp_path):
    runs = tmp_path / "runs"
    first = [take(repo, runs) for _ in range(50)]  # 50 resubmissions of an unchanged tree
    assert len({c.digest for c in first}) == 1 and len(list((runs / STORE / "trees").glob("*.json"))) == 1
    objects = sorted((runs / STORE / "objects").rglob("*"))
    (repo / "main.py").write_text(SCRIPT.replace("one", "two"))
    second = take(repo, runs)
    assert second.digest != first[0].digest
    added = set((runs / STORE / "objects").rglob("*")) - set(objects)
    assert len([p for p in added if p.is_file()]) == 1  # the one file that changed
    assert os.stat(Path(second.tree) / "lib/util.py").st_ino == os.stat(Path(first[0].tree) / "lib/util.py").st_ino
    assert not os.access(Path(second.tree) / "main.py", os.W_OK) or os.geteuid() == 0  # read-only content


def test_a_program_outside_every_git_tree_is_its_directory_said_once(tmp_path):
    folder = tmp_path / "plain"
    (folder / ".venv/lib").mkdir(parents=True)
    (folder / ".venv/lib/site.py").write_text("")
    (folder / "train.py").write_text(SCRIPT)
    (folder / "runs").mkdir()
    (folder / "runs/old.log").write_text("a log")
    code = take(folder, folder / "runs")
    assert files_of(code) == {"train.py"} and code.git is None  # no environment, no logs
    assert code.notes == [
        f"{folder} is in no git work tree: the snapshot is its directory (1 files), less checkpoints, runs, *.pt "
        "and the like, and what .kitignore says"
    ]


def test_a_project_outside_git_leaves_out_checkpoints_and_what_its_kitignore_says_and_says_when_large(tmp_path):
    """Issue 71: outside git, what training writes stays out by default (checkpoints/, *.pt, an
    output folder that is not the log root), and a .kitignore's gitignore-style lines add
    patterns (``/`` anchors to the root) or keep a default (``!``); above 20 MB the snapshot
    says what it took and how to leave things out."""
    folder = tmp_path / "project"
    for rel in ("train.py", "model.pt", "checkpoints/step_10/x.distcp", "data/raw.bin", "src/data/loader.py",
                "weights/best.pt", "notes.md", "src/runs/helpers.py"):  # fmt: skip
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text("x")
    (folder / ".kitignore").write_text("# mine\n/data\nnotes.md\n!*.pt\n")
    code = take(folder, tmp_path / "logs")
    # the defaults' folders at the root only: a package's own runs/ module travels
    assert files_of(code) == {"train.py", "src/data/loader.py", "model.pt", "weights/best.pt", ".kitignore",
                              "src/runs/helpers.py"}  # fmt: skip
    (folder / "big.bin").write_bytes(b"\0" * 21_000_000)
    (note,) = [n for n in take(folder, tmp_path / "logs", write=False).notes if "MB" in n]
    assert "21.0 MB in 7 files (largest: big.bin (21.0 MB)" in note and ".kitignore" in note


def test_a_submodules_files_are_in_the_snapshot(repo, tmp_path):
    sub = make_repo(tmp_path / "sub", {"helpers.py": "H = 1\n"})
    git(repo, "submodule", "add", "-q", str(sub), "vendor/sub")
    git(repo, "commit", "-qm", "submodule")
    (repo / "vendor/sub/helpers.py").write_text("H = 2\n")  # changed inside the submodule
    code = take(repo, tmp_path / "runs")
    assert "vendor/sub/helpers.py" in files_of(code)
    assert (Path(code.tree) / "vendor/sub/helpers.py").read_text() == "H = 2\n"


def test_a_file_that_disappears_between_listing_and_copying_is_left_out_and_said(repo, tmp_path, monkeypatch):
    listed = snap.file_stats

    def list_then_delete(*args):
        found = listed(*args)
        (repo / "lib/util.py").unlink()
        return found

    monkeypatch.setattr(snap, "file_stats", list_then_delete)
    code = take(repo, tmp_path / "runs")
    assert "lib/util.py" not in files_of(code)
    assert code.notes == ["lib/util.py: gone between listing and copying, not in the snapshot"]


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_log_root_that_cannot_be_written_is_bad_input_and_leaves_no_tree(fault, repo, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    if fault == "read-only":
        if os.geteuid() == 0:  # root writes anyway: the same error as the kernel's
            monkeypatch.setattr(snap.tempfile, "mkstemp", raise_errno(errno.EROFS))
        runs.chmod(0o555)
    else:
        real = snap.write_new
        calls = []

        def full_after_two(path, data, mode):  # the disk fills part-way
            calls.append(path)
            if len(calls) > 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(path, data, mode)

        monkeypatch.setattr(snap, "write_new", full_after_two)
    try:
        with pytest.raises(ConfigError, match=f"{runs / STORE}: cannot write the code snapshot there"):
            take(repo, runs)
    finally:
        runs.chmod(0o755)
    assert not list(runs.rglob("trees/*"))  # complete or absent


def raise_errno(number):
    def fail(*args, **kwargs):
        raise OSError(number, os.strerror(number))

    return fail


TAKE = "import sys; from pathlib import Path; from cluster.provenance.snapshot import take; print(take(Path(sys.argv[1]), Path(sys.argv[2])).digest)"


def test_two_submissions_at_once_share_one_store(repo, tmp_path):
    runs = tmp_path / "runs"
    takers = [
        subprocess.Popen([sys.executable, "-c", TAKE, str(repo), str(runs)], stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]  # eight processes at once, each its own snapshot of the same tree into one store
    digests = {taker.communicate(timeout=120)[0].strip() for taker in takers}
    assert len(digests) == 1 and all(taker.returncode == 0 for taker in takers)
    (digest,) = digests
    assert sorted(p.name for p in (runs / STORE / "trees").iterdir()) == [digest, f"{digest}.json"]  # no temporary tree
    assert files_of(take(repo, runs)) == {".gitignore", "job.yaml", "lib/util.py", "main.py"}


def test_a_tree_over_the_limit_exits_2_naming_its_largest_files_and_submits_nothing(repo, tmp_path):
    (repo / "weights.bin").write_bytes(os.urandom(3_000_000))
    result = run_module("cluster", "submit", "job.yaml", f"log_dir={tmp_path / 'runs'}", "snapshot.max_mb=2", cwd=repo)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.startswith("error: snapshot.max_mb: the code snapshot of")
        and "weights.bin (3.0 MB)" in result.stderr
    )
    assert not (tmp_path / "runs").exists()


def test_dry_run_shows_where_the_code_comes_from_and_snapshot_false_turns_it_off(repo, tmp_path):
    runs = tmp_path / "runs"
    shown = run_module("cluster", "submit", "job.yaml", f"log_dir={runs}", "--dry-run", cwd=repo)
    assert shown.returncode == 0, shown.stderr
    digest = take(repo, runs, write=False).digest
    assert f"# Code: snapshot {digest[:12]} of {repo} (git " in shown.stdout
    assert f"--script={runs}/{STORE}/trees/{digest}/main.py" in shown.stdout
    assert not runs.exists()  # a dry run stores nothing
    off = run_module("cluster", "submit", "job.yaml", f"log_dir={runs}", "--dry-run", "snapshot=false", cwd=repo)
    assert off.returncode == 0 and "# Code:" not in off.stdout and "--script=main.py" in off.stdout


def test_bad_snapshot_keys_exit_2_naming_the_key(repo, tmp_path):
    for override, key in (("snapshot.exclude=[/abs]", "snapshot.exclude[0]"), ("snapshot.bogus=1", "snapshot.bogus")):
        result = run_module("cluster", "submit", "job.yaml", f"log_dir={tmp_path}", override, "--dry-run", cwd=repo)
        assert result.returncode == 2 and result.stderr.startswith(f"error: {key}"), result.stderr


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "docker"])
def test_the_snapshot_is_mounted_read_only_at_its_own_path_in_every_container(runtime, repo, tmp_path):
    from cluster.launcher.containers import mounts
    from cluster.plan import make_plan
    from cluster.request import make_request
    from cluster.spec import JobSpec
    from train.contract.config import build

    code = take(repo, tmp_path / "runs")
    container = {"image": "kit:test", **({"runtime": runtime} if runtime != "docker" else {})}
    cluster = "docker" if runtime == "docker" else "slurm"
    spec = build(JobSpec, {"cluster": cluster, "container": container, "program": {"script": str(repo / "main.py")}})
    request = make_request(spec, make_plan(spec), "python", code=code)
    command = " ".join(request.steps[0].command)
    assert f"--script={code.tree}/main.py" in command and f"--code={repo}={code.tree}" in command
    if runtime == "pyxis":
        assert f"--container-mounts={code.tree}:{code.tree}:ro" in request.srun
    elif runtime == "apptainer":
        assert f"--bind={code.tree}:{code.tree}:ro" in request.steps[0].command
    else:
        assert mounts(request, tmp_path / "job", str(tmp_path))[code.tree] == {"bind": code.tree, "mode": "ro"}


def test_the_shim_imports_the_projects_code_from_the_snapshot_and_the_rest_where_it_is(repo, tmp_path):
    from train.rank.shim import in_snapshot

    (repo / ".venv/lib/site-packages").mkdir(parents=True)  # a virtual environment inside the project
    code = take(repo, tmp_path / "runs")
    root, tree = str(repo), code.tree
    assert in_snapshot(str(repo / "lib"), root, tree) == f"{tree}/lib"
    assert in_snapshot(str(repo), root, tree) == tree
    assert in_snapshot(str(repo / ".venv/lib/site-packages"), root, tree) == str(repo / ".venv/lib/site-packages")
    assert in_snapshot("/usr/lib/python3", root, tree) == "/usr/lib/python3"


def test_the_kits_snapshot_goes_first_on_the_path_and_the_inherited_one_after_it(repo, tmp_path, monkeypatch):
    """A GPU box's packages on PYTHONPATH (no pip there) reach the ranks that import the kit from
    its snapshot; the spec's own PYTHONPATH takes the inherited one's place, as an export would."""
    from dataclasses import replace

    from cluster.plan import make_plan
    from cluster.request import make_request
    from cluster.spec import JobSpec
    from train.contract.config import build

    code = replace(take(repo, tmp_path / "runs"), kit=True)
    for env, want in [({}, f"{code.tree}:/opt/site"), ({"PYTHONPATH": "lib"}, f"{code.tree}:lib")]:
        spec = build(JobSpec, {"cluster": "local", "env": env})
        request = make_request(spec, make_plan(spec), "python", code=code, pythonpath="/opt/site")
        assert dict(request.env)["PYTHONPATH"] == want


def test_a_start_records_versions_read_from_folder_names_match_the_metadata(tmp_path, monkeypatch):
    """runtime_packages reads no metadata file: the same versions as installed_packages, which
    reads them all, with the first of two torches on the path winning as in an import."""
    from train.contract.protocol import installed_packages, runtime_packages, runtime_versions

    wheels = {"first": {"torch": "2.11.0+cu130", "nvidia_nccl_cu13": "2.28.3", "nvidia_cuda_runtime": "13.0.96",
                        "torchmetrics": "1.9.0", "PyYAML": "6.0.2"},
              "second": {"torch": "2.6.0", "torch_cluster_kit": "0.1.0"}}  # fmt: skip
    for entry, dists in wheels.items():
        for name, version in dists.items():
            info = tmp_path / entry / f"{name}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "first"), str(tmp_path / "missing"), str(tmp_path / "second")])
    assert runtime_versions() == runtime_versions(installed_packages())
    assert runtime_packages() == {"torch": "2.11.0+cu130", "nvidia-nccl-cu13": "2.28.3",
                                  "nvidia-cuda-runtime": "13.0.96", "torch-cluster-kit": "0.1.0"}  # fmt: skip


@pytest.mark.parametrize(
    "where, overrides, rule",
    [
        ("runs/mine/t.py", ["log_dir=runs"], "under the job's log root (runs)"),
        ("scratch/t.py", ['snapshot.exclude=["scratch"]'], "snapshot.exclude's pattern 'scratch'"),
        ("data/t.py", [], "git ignores it (.gitignore)"),
        ("other/.snapshots/t.py", [], "always leaves out '.snapshots'"),  # another log root's code store
    ],
)  # fmt: skip
def test_a_program_a_snapshot_rule_leaves_out_is_refused_naming_the_rule(repo, where, overrides, rule):
    """A script kept next to its results (under the log root), excluded, or ignored by git is
    not in the snapshot the ranks run: the submission exits 2 saying which rule and what to do,
    and nothing is submitted (no job directory, no snapshot stored)."""
    (repo / where).parent.mkdir(parents=True, exist_ok=True)
    (repo / where).write_text("print('run')\n")
    done = run_module("cluster", "submit", "job.yaml", f"program.script={where}", *overrides, cwd=repo)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"error: program.script: {where} would not be in the job's code snapshot" in done.stderr
    assert rule in done.stderr
    assert not list(repo.rglob("plan.json")) and not list(repo.rglob("trees"))


def test_a_program_under_the_log_root_runs_without_a_snapshot(repo):
    """What the message offers: snapshot=false runs the file where it lies."""
    (repo / "runs/mine").mkdir(parents=True)
    (repo / "runs/mine/t.py").write_text("print('ran from the log root')\n")
    done = run_module("cluster", "submit", "job.yaml", "program.script=runs/mine/t.py", "log_dir=runs",
                      "snapshot=false", "--wait", cwd=repo)  # fmt: skip
    assert done.returncode == 0 and "ran from the log root" in done.stdout, done.stderr[-2000:]


def test_diff_leaves_out_the_kits_note_of_where_shipped_code_came_from(tmp_path):
    """Two shipped snapshots: their .kit-origin.json (the laptop, its time, its git facts) differs
    at every shipping and is provenance, not code; the file changed is all ``diff`` lists."""
    from cluster.provenance.compare import Side, code_diff
    from cluster.provenance.snapshot import ORIGIN

    sides = []
    for n, code in ((1, "x = 1\n"), (2, "x = 2\n")):
        tree = tmp_path / f"tree{n}"
        tree.mkdir()
        (tree / "train.py").write_text(code)
        (tree / ORIGIN).write_text(f'{{"shipped": {n}}}')
        sides.append(Side(f"job {n}", files=tree, manifest={"train.py": [code], ORIGIN: [n]}))
    result = code_diff(*sides, stat=True)
    assert [f["path"] for f in result["files"]] == ["train.py"]
