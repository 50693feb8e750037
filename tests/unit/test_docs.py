"""The README is a front page and docs/ its reference: the README stays short, every relative
link in both resolves (to a file, and to a heading where it names one), every command in the
README's shell blocks is one the kit accepts (its parser, a make target, a module that
exists; no job runs), and docs/architecture.md's table names every module of the kit."""

import importlib.util
import re
import shlex

import pytest

from cluster.cli import build_parser, split_program_args
from tests.conftest import ROOT, run_module

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(bash|sh|console)\n(.*?)^```", re.M | re.S)  # shell blocks; diagrams and output are plain


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def dead_links(page) -> list[str]:
    dead = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{target}: no such file")
        elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)}:
            dead.append(f"{target}: no such heading in {file.name}")
    return dead


def refused(command: list[str]) -> str | None:
    """Why the kit would not accept ``command`` (None: it would), without running a job."""
    if command[:3] == ["python", "-m", "cluster"] or command[:1] == ["cluster-kit"]:
        argv, _ = split_program_args(command[3:] if command[0] == "python" else command[1:])
        parser = build_parser(argv)
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit:
            return "the parser refused it"
        leftover = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
        return f"unrecognized {leftover}" if leftover else None
    if command[:2] == ["python", "-m"] or command[:2] == ["python", "-c"]:
        module = command[2].split()[0] if command[1] == "-m" else None
        return None if module is None or importlib.util.find_spec(module) else f"no module {module}"
    if command[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        missing = [t for t in command[1:] if "=" not in t and t not in targets]
        return f"no make target {missing}" if missing else None
    return f"not a command of the kit: {command[0]}"


def readme_commands() -> list[list[str]]:
    commands = []
    for _, block in FENCE.findall(README.read_text()):
        for line in block.splitlines():
            line = line.removeprefix("$ ").strip()
            if not line.startswith(("python ", "make ", "cluster-kit")):
                continue  # output, YAML
            for part in line.split("&&"):
                commands.append(shlex.split(part, comments=True))
    return commands


def test_the_readme_is_a_front_page():
    assert README.stat().st_size <= 12 * 1024


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    assert dead_links(page) == []


def test_a_dead_link_and_a_missing_heading_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](#top) [gone](nowhere.md) [bad](page.md#no-such) [web](https://example.org)\n")
    assert dead_links(page) == ["nowhere.md: no such file", "page.md#no-such: no such heading in page.md"]


def test_every_command_in_the_readme_is_accepted():
    commands = readme_commands()
    assert len(commands) > 15
    assert {c: why for c, why in ((shlex.join(c), refused(c)) for c in commands) if why} == {}


def test_a_command_the_kit_would_refuse_is_found():
    assert refused(["python", "-m", "cluster", "submit", "jobs/local.yaml", "--no-such-flag"])
    assert refused(["python", "-m", "cluster", "explode"])
    assert refused(["make", "no-such-target"])
    assert refused(["python", "-m", "cluster.no_such_module"])
    assert refused(["python", "-m", "cluster", "logs", "12345", "--json"]) is None


def test_the_layout_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = [p for pkg in ("cluster", "train") for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py"]
    unnamed = []
    for path in modules:
        relative = str(path.relative_to(ROOT))
        folder = f"`{path.parent.relative_to(ROOT)}/`"
        # a folder's row may name its files: `cluster/logs/` | `scan.py` ...
        if f"`{relative}`" not in text and not (folder in text and f"`{path.name}`" in text):
            unnamed.append(relative)
    assert unnamed == []


def test_every_path_the_architecture_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:cluster|train|bench|fixtures|tests|jobs|docker)/[\w./-]*)`", text))
    assert len(named) > 30
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_every_command_that_starts_a_job_takes_wait_and_json():
    """What a newcomer tries first: `cluster rerun JOB --wait` was refused once."""
    for command in (["submit", "jobs/local.yaml"], ["rerun", "runs/x/1"], ["resume", "runs/x/1"],
                    ["sweep", "jobs/local.yaml", "a=1,2"], ["preflight", "jobs/local.yaml"]):  # fmt: skip
        assert refused(["python", "-m", "cluster", *command, "--wait", "--json"]) is None, command


def test_every_help_fits_one_screen_and_the_keys_are_listed_with_the_faults_apart():
    """--help of the kit and of each command: 30 lines or fewer (the spec's keys are `keys`'s);
    `cluster-kit keys` lists every key of the schema, the failures made on purpose under their
    own heading, and a prefix that no key has is bad input."""
    from cluster.cli import COMMANDS
    from cluster.spec import JobSpec
    from train.contract.config import describe

    for command in ["", *COMMANDS]:
        done = run_module("cluster", *([command] if command else []), "--help")
        lines = done.stdout.splitlines()
        assert done.returncode == 0 and 0 < len(lines) <= 30, (command, len(lines), done.stdout)
        assert "cluster-kit" in lines[0], lines[0]  # one name: the usage line says the command people type
    listed = run_module("cluster", "keys").stdout
    assert all(f"  {key} " in listed for key, _, _ in describe(JobSpec))
    normal, faults = listed.split("failures made on purpose")
    assert "train.fail_at_step" in faults and "train.fail_at_step" not in normal and "train.steps" in normal
    assert "optimizer steps of the run" in run_module("cluster", "keys", "train.steps").stdout  # its note
    assert run_module("cluster", "keys", "nosuch").returncode == 2


def test_a_modules_docstring_is_ten_lines_at_most_and_its_rest_is_in_the_internals_page():
    """Issue 72: code first; what a module's opening says beyond 10 lines is in
    docs/internals.md, under the module's path, and the docstring points there."""
    import ast

    internals = (ROOT / "docs" / "internals.md").read_text()
    long, unpointed = [], []
    for path in sorted(p for pkg in ("cluster", "train") for p in (ROOT / pkg).rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        rel = str(path.relative_to(ROOT))
        if doc.count("\n") + 1 > 10:
            long.append(rel)
        if "docs/internals.md" in doc and f"## `{rel}`" not in internals:
            unpointed.append(rel)
    assert long == [] and unpointed == []
