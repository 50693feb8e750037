"""docs/architecture.md's rules, each checked here by its name: a rule the page states and no
test checks, or a check whose rule the page no longer states, fails the suite."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.test_imports import import_cycle, kit_files, module_imports, module_name

PAGE = ROOT / "docs" / "architecture.md"


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (functions too), by its full name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def module_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported (not those its functions import on use)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def files(*folders: str) -> list[Path]:
    found = [(ROOT / f).rglob("*.py") if (ROOT / f).is_dir() else [ROOT / f] for f in folders]
    return sorted(p for paths in found for p in paths if p.exists())


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def importing(paths: list[Path], bad) -> list[str]:
    """'file: module' for each import of ``paths`` that ``bad(module)`` refuses."""
    return [f"{rel(p)}: {m}" for p in paths for m in sorted(imports_of(p)) if bad(m)]


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# ----------------------------------------------------------------------------- the rules
def train_alone() -> list[str]:
    return importing(files("train"), lambda m: under(m, "cluster", "bench", "fixtures", "tests"))


def the_contract() -> list[str]:
    """cluster imports of train only train.contract; train.contract imports no torch and nothing
    of train outside it; and train/ keeps at most 6 modules at its top level."""
    bad = importing(files("cluster"), lambda m: under(m, "train") and not under(m, "train.contract"))
    bad += importing(files("train/contract"), lambda m: under(m, "train") and not under(m, "train.contract"))
    bad += [f"{rel(p)}: {m}" for p in files("train/contract") for m in sorted(module_level_imports(p))
            if under(m, "torch", "numpy")]  # fmt: skip
    top = sorted(p.name for p in (ROOT / "train").glob("*.py"))
    return bad + ([f"train/ has {len(top)} top-level modules: {top}"] if len(top) > 6 else [])


READERS = ("cluster/logs", "cluster/views", "cluster/goodput", "cluster/provenance/reading.py", "cluster/sweeps/table.py",
           "cluster/restarts")  # fmt: skip


def the_spec_is_a_schema() -> list[str]:
    bad = importing(files("cluster/spec.py"),
                    lambda m: under(m, "os", "shutil", "subprocess", "importlib", "cluster.backends"))  # fmt: skip
    bad += importing(files(*READERS), lambda m: under(m, "cluster.checks", "cluster.submission"))
    loads = (ROOT / "cluster" / "submission.py").read_text()
    return bad + ([] if "check_submission(spec)" in loads else ["cluster/submission.py: load_spec checks nothing"])


IMPURE = re.compile(r"\bos\.environ\b|\bopen\(|\bsubprocess\b|\bshutil\b|\.(read_text|write_text|read_bytes|write_bytes|"
                    r"exists|is_file|is_dir|mkdir|unlink|stat)\(|\btime\.time\(")  # fmt: skip


def pure_translation() -> list[str]:
    bad = []
    for path in files("cluster/plan.py", "cluster/request.py", "cluster/render.py"):
        code = ast.unparse(ast.parse(path.read_text()))  # code alone: no comments, no docstrings' words
        code = "\n".join(line for line in code.splitlines() if not line.strip().startswith(("'", '"')))
        bad += [f"{rel(path)}: {m.group(0)}" for m in IMPURE.finditer(code)]
        bad += importing([path], lambda m: under(m, "os", "subprocess", "shutil", "socket"))
    return bad


BACKEND_PACKAGES = ("cluster.backends.slurm", "cluster.backends.local", "cluster.backends.docker")


def one_registry() -> list[str]:
    outside = [p for p in files("cluster") if "cluster/backends/" not in rel(p) + "/"]
    bad = importing(outside, lambda m: under(m, *BACKEND_PACKAGES))
    for package in BACKEND_PACKAGES:
        mine = files(package.replace(".", "/") + (".py" if package.endswith(("local", "docker")) else ""))
        others = [o for o in BACKEND_PACKAGES if o != package]
        bad += importing(mine, lambda m, others=others: under(m, *others))
    branch = re.compile(r"cluster (==|!=) |\.cluster in ")
    bad += [f"{rel(p)}: branches on the scheduler" for p in outside if branch.search(p.read_text())]
    return bad


def restarts_are_one_concept() -> list[str]:
    bad = importing(files("cluster/restarts"), lambda m: under(m, "cluster.backends"))
    talks = [p for p in files("cluster") if "scontrol" in p.read_text() and "restarts" in rel(p)]
    return bad + [f"{rel(p)}: talks to SLURM" for p in talks]


def the_command_line_parses_and_prints() -> list[str]:
    return importing(
        files("cluster/cli"), lambda m: under(m, "subprocess", "time", "cluster.system", "cluster.backends")
    )


def only_the_command_that_runs() -> list[str]:
    code = ("import sys, cluster.cli.logs; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('matplotlib', 'torch') or m in ('cluster.submission', 'cluster.checks', 'cluster.request'))))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f"cluster logs imports {m}" for m in done.stdout.split()]


def no_cycles() -> list[str]:
    paths = kit_files()
    known = {module_name(p) for p in paths}
    cycle = import_cycle({module_name(p): module_imports(p, known) - {module_name(p)} for p in paths})
    return [" -> ".join(cycle)] if cycle else []


def views_from_the_reading() -> list[str]:
    bad = importing(files("cluster/logs"), lambda m: under(m, "cluster.views"))
    return bad + importing(
        files("cluster/views"), lambda m: under(m, "cluster.submission", "cluster.checks", "cluster.request")
    )


RULES = {
    "train alone": train_alone,
    "the contract": the_contract,
    "the spec is a schema": the_spec_is_a_schema,
    "pure translation": pure_translation,
    "one registry": one_registry,
    "restarts are one concept": restarts_are_one_concept,
    "the command line parses and prints": the_command_line_parses_and_prints,
    "only the command that runs": only_the_command_that_runs,
    "no cycles": no_cycles,
    "views from the reading": views_from_the_reading,
}


def stated() -> list[str]:
    """The rules' names, as the page states them (``- **name**: ...`` under "The arrows")."""
    text = PAGE.read_text()
    section = text[text.index("## The arrows") : text.index("## Every module")]
    return re.findall(r"^- \*\*(.+?)\*\*:", section, re.M)


def test_the_page_states_exactly_the_rules_checked_here():
    assert sorted(stated()) == sorted(RULES)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_code_keeps_the_rule(rule):
    assert RULES[rule]() == []


def test_a_broken_rule_is_found(tmp_path, monkeypatch):
    """The checks see what they look for: an import of the submission from a reader, a read of
    the environment in the plan."""
    reader = tmp_path / "cluster" / "logs" / "x.py"
    reader.parent.mkdir(parents=True)
    reader.write_text("def f():\n    from cluster.submission import load_spec  # lazy\n")
    plan = tmp_path / "cluster" / "plan.py"
    plan.write_text("import os\nX = os.environ['HOME']\n")
    (tmp_path / "cluster" / "submission.py").write_text("spec = check_submission(spec)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert views_from_the_reading() == [] and the_spec_is_a_schema()[0] == "cluster/logs/x.py: cluster.submission"
    assert "cluster/plan.py: os.environ" in pure_translation()
