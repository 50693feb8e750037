"""The remote work's pure parts, from tables: named clusters and ssh's aliases, ssh's reasons,
the command line there with the cluster's defaults, ``--on`` taken from a command line."""

import pytest

from cluster.cli import take_on
from cluster.remote.clusters import RemoteCluster, find, known, ssh_aliases
from cluster.remote.forward import as_here
from cluster.remote.serve import with_defaults
from cluster.remote.ssh import remote_path, why
from cluster.remote.there import kit_command, refusal
from train.contract.errors import ConfigError


def test_ssh_aliases_are_clusters_and_a_projects_file_says_where_jobs_go_never_how_to_connect(tmp_path):
    home, project = tmp_path / "home", tmp_path / "project" / "src"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host login *.example !bad\n  User me\nHost gpu-box # a comment\n")
    (home / ".config" / "cluster-kit").mkdir(parents=True)
    (home / ".config" / "cluster-kit" / "clusters.yaml").write_text(
        "gpu-box: {ssh: gpu-box, log_root: /scratch/runs}\n"
    )
    (project / ".cluster-kit").mkdir(parents=True)
    (project.parent / ".cluster-kit").mkdir()
    (project.parent / ".cluster-kit" / "clusters.yaml").write_text("gpu-box: {log_root: /project/runs}\n")
    found = known(cwd=project, home=home)
    assert sorted(found) == ["gpu-box", "login"]
    assert found["login"] == RemoteCluster(name="login", ssh="login", ssh_config=str(home / ".ssh" / "config"))
    assert found["gpu-box"].target == "gpu-box" and found["gpu-box"].log_root == "/project/runs"  # the project's
    with pytest.raises(ConfigError) as raised:
        find("logn", cwd=project, home=home)
    assert raised.value.key == "--on" and "did you mean 'login'?" in str(raised.value)
    # how to connect is never a cloned repository's to say (a ProxyCommand would run here)
    (project.parent / ".cluster-kit" / "clusters.yaml").write_text("gpu-box: {ssh_config: ./evil, log_root: /x}\n")
    with pytest.raises(ConfigError) as raised:
        known(cwd=project, home=home)
    assert raised.value.key.endswith("gpu-box.ssh_config") and "how to connect" in str(raised.value)


def test_a_clusters_unknown_key_is_named(tmp_path):
    (tmp_path / ".config" / "cluster-kit").mkdir(parents=True)
    (tmp_path / ".config" / "cluster-kit" / "clusters.yaml").write_text("a: {ssh: a, partiton: gpu}\n")
    with pytest.raises(ConfigError) as raised:
        known(cwd=tmp_path, home=tmp_path)
    assert raised.value.key.endswith("a.partiton") and "did you mean" in str(raised.value)


def test_ssh_aliases_leave_patterns_out():
    assert ssh_aliases("host a b*\nHostName x\nHost c ?d !e\n# Host f\n") == ["a", "c"]


@pytest.mark.parametrize("stderr, said", [
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\n...", "its host key has CHANGED"),
    ("Host key verification failed.\n", "is not in known_hosts"),
    ("ssh: connect to host 127.0.0.1 port 1: Connection refused\n", "ssh: connect to host 127.0.0.1 port 1: Connection refused"),
    ("", "ssh failed and said nothing"),
])  # fmt: skip
def test_ssh_s_reason_is_said_in_a_line(stderr, said):
    assert said in why(stderr)


@pytest.mark.parametrize("command, args, expected", [
    ("submit", ["job.yaml", "nodes=2"], ["job.yaml", "nodes=2", "log_dir=/r", "partition=p"]),
    ("submit", ["s.py", "log_dir=mine", "--", "--lr", "1"], ["s.py", "log_dir=mine", "partition=p", "--", "--lr", "1"]),
    ("logs", ["12"], ["12", "--log-dir", "/r"]),
    ("logs", ["12", "--log-dir=x"], ["12", "--log-dir=x"]),
    ("keys", ["train"], ["train"]),
])  # fmt: skip
def test_the_clusters_defaults_go_under_what_a_command_does_not_give(command, args, expected):
    assert with_defaults(command, args, "/r", "p", "") == expected


@pytest.mark.parametrize("argv, expected", [
    (["logs", "12", "--on", "a"], ("a", ["logs", "12"])),
    (["logs", "--on=a", "12"], ("a", ["logs", "12"])),
    (["logs", "12"], (None, ["logs", "12"])),
])  # fmt: skip
def test_on_is_taken_from_the_command_line(argv, expected):
    assert take_on(argv) == expected


def test_the_command_there_quotes_everything_and_keeps_homes_remote():
    c = RemoteCluster(name="a", ssh="a", python="~/venv/bin/python", log_root="~/my runs", account="x y")
    command = kit_command(c, "abc", "~/p", ["submit", "a b.yaml", "name=it's"])
    assert '"$HOME"/venv/bin/python -u -P -m cluster.remote.serve abc --log-root "$HOME"\'/my runs\'' in command
    assert "--account 'x y'" in command and "'a b.yaml' 'name=it'\"'\"'s'" in command
    assert remote_path("/abs path") == "'/abs path'" and remote_path("~") == '"$HOME"'


def test_the_kit_theres_refusals_are_bad_input_naming_the_cluster():
    c = RemoteCluster(name="a", ssh="a")
    assert "clusters setup a" in str(refusal(c, "v2", "kit-missing v1 v0\n"))
    assert "version v1, here v2" in str(refusal(c, "v2", "kit-version v1\n"))
    assert refusal(c, "v2", "Traceback ...\n") is None


def test_what_comes_back_is_read_after_what_a_login_shell_printed_first(tmp_path):
    import io
    import tarfile

    from cluster.remote import TAR_MARK
    from cluster.remote.fetch import json_of, unpack

    assert json_of(b'welcome to the cluster!\n{"log_dir": "/r/1"}\n') == {"log_dir": "/r/1"}
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        info = tarfile.TarInfo("tensorboard/events")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    unpack(b"motd line\n" + TAR_MARK + packed.getvalue(), tmp_path)
    assert (tmp_path / "tensorboard" / "events").read_bytes() == b"ok"


@pytest.mark.parametrize(
    "there, here",
    [
        (b"inspect: cluster-kit logs /home/me/runs/mine/2500\n", b"inspect: cluster-kit logs 2500 --on box\n"),
        (b"page: file:///home/me/runs/mine/2500/page.html\n", b"page: cluster-kit page 2500 --on box\n"),
        (b"page: file:///home/me/runs/index.html\n", b"page: file:///home/me/runs/index.html\n"),  # no job's
        (b"step 20 loss 0.1\n", b"step 20 loss 0.1\n"),
    ],
)
def test_a_hint_of_a_path_there_is_said_as_the_command_here(there, here):
    assert as_here(there, "box") == here
