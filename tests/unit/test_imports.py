"""The kit's imports: every ``import``/``from ... import`` of its own modules resolves, at
module level and inside functions (imported on use, a broken one hides until its path runs: a
GPU-only path's until a machine with CUDA runs it); no two modules import each other,
however far round; and an import inside a function says why it waits (start-up time), never
to hide a cycle."""

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

from cluster.backends import BACKENDS
from cluster.cli import COMMANDS
from tests.conftest import ROOT

PACKAGES = ("cluster", "train")
CHECKED = (*PACKAGES, "bench", "fixtures")  # beside tests/: not installed, but kept honest


def unresolved(path: Path) -> list[str]:
    """The kit imports in ``path`` that do not resolve: 'line N: from M import X'."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in CHECKED:
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                bad.append(f"line {node.lineno}: from {node.module} import ... ({exc})")
                continue
            for alias in node.names:
                found = hasattr(module, alias.name) or (
                    hasattr(module, "__path__") and importlib.util.find_spec(f"{node.module}.{alias.name}")
                )
                if not found:
                    bad.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in CHECKED and importlib.util.find_spec(alias.name) is None:
                    bad.append(f"line {node.lineno}: import {alias.name}")
    return bad


def kit_files() -> list[Path]:
    return sorted(p for package in CHECKED for p in (ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, known: set[str]) -> set[str]:
    """The kit modules ``path`` imports anywhere: at module level, inside ``if TYPE_CHECKING:``
    and inside functions (an import deferred to a function is an edge all the same: deferring
    one must never be what hides a cycle). ``from a import b`` of a module ``a.b`` counts as ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in CHECKED:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
            if len(subs) < len(node.names):  # names of the module itself, not submodules
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in CHECKED}
    return found & known


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (a module, what it imports, ..., the module again), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def unexplained_lazy_imports(path: Path) -> list[str]:
    """Functions whose first import has no comment saying why it waits (on its line or the
    line before); the imports after it in the same function share its reason."""
    lines = path.read_text().splitlines()
    bad = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            imports = sorted(
                (n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)), key=lambda n: n.lineno
            )
            if imports:
                first = imports[0].lineno
                if "#" not in lines[first - 1] and not lines[first - 2].strip().startswith("#"):
                    bad.append(f"line {first}: {lines[first - 1].strip()}")
    return bad


def test_no_module_of_the_kit_imports_itself_round_a_cycle():
    files = kit_files()
    known = {module_name(p) for p in files}
    graph = {module_name(p): module_imports(p, known) - {module_name(p)} for p in files}
    # The registry imports each backend by its name, when a job asks for it: edges all the same.
    graph["cluster.backends"] |= {where.partition(":")[0] for where in BACKENDS.values()}
    # The command line imports the command it runs by its name: edges too.
    graph["cluster.cli"] |= {f"cluster.cli.{name}" for name in COMMANDS}
    assert "cluster.backends.slurm.backend" in graph["cluster.backends"]
    assert import_cycle(graph) == []


def test_a_cycle_is_found():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) == []


def test_every_import_inside_a_function_says_why_it_waits():
    bad = {str(p.relative_to(ROOT)): found for p in kit_files() if (found := unexplained_lazy_imports(p))}
    assert not bad, bad


def test_every_kit_import_in_the_runtime_packages_resolves():
    files = kit_files()
    assert len(files) > 40
    broken = {str(p.relative_to(ROOT)): bad for p in files if (bad := unresolved(p))}
    assert not broken, broken


def test_a_broken_import_inside_a_function_is_found(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "from cluster.spec import JobSpec\n\n"
        "def gpu_path():\n    from cluster.submission import no_such_name\n    import train.no_such_module\n"
    )
    assert unresolved(source) == [
        "line 4: from cluster.submission import no_such_name",
        "line 5: import train.no_such_module",
    ]


def imported_tops(path: Path) -> set[str]:
    """The top-level names of everything ``path`` imports, anywhere in it."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            tops.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
    return tops


def test_the_arrows_between_the_folders():
    """train/ runs on a rank alone; cluster/ is the driver; bench/ and fixtures/ import no test;
    only the tests of the benchmarks (tests/bench/) import bench/."""
    forbidden = {"train": {"cluster", "bench", "fixtures", "tests"}, "cluster": {"bench", "fixtures", "tests"},
                 "bench": {"tests"}, "fixtures": {"tests", "bench"}}  # fmt: skip
    bad = [f"{p.relative_to(ROOT)} imports {sorted(imported_tops(p) & never)}"
           for top, never in forbidden.items() for p in (ROOT / top).rglob("*.py") if imported_tops(p) & never]  # fmt: skip
    bad += [str(p.relative_to(ROOT)) + " imports bench" for p in (ROOT / "tests").rglob("*.py")
            if "bench" in imported_tops(p) and (ROOT / "tests" / "bench") not in p.parents]  # fmt: skip
    assert bad == []


def test_the_minicluster_starts_with_the_standard_library_alone():
    """tests/provision.sh starts it with the machine's python3, before any venv (.ci/run)."""
    done = subprocess.run([sys.executable, "-S", "-c", "import cluster.system.minicluster"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_config_error_has_one_import_path():
    """Issue 72: ``ConfigError`` comes from ``train.contract.errors`` everywhere (``train.contract.config`` holds it
    only to raise it), so a reader finds one home for the kit's bad-input error."""
    elsewhere = []
    for path in [*(p for pkg in (*CHECKED, "tests") for p in (ROOT / pkg).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "train.contract.errors":
                if any(alias.name == "ConfigError" for alias in node.names) and node.module.startswith(
                    ("train", "cluster")
                ):
                    elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert elsewhere == []


def test_planning_a_slurm_spec_imports_no_backend_module():
    """Issue 72: the plan is pure: a backend's static facts (traits, how a node and the
    rendezvous are named) are data in the registry (``cluster.backends.facts.FACTS``), so planning
    asks no backend's module. In a fresh interpreter: nothing imported before counts."""
    code = ("import sys; from cluster.plan import make_plan; from cluster.spec import JobSpec; "
            "from train.contract.config import load; plan = make_plan(load(JobSpec, 'jobs/multi_node.yaml', []));"
            "print(plan.ranks[-1].host, sorted(m for m in sys.modules if m.startswith('cluster.backends.')))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    host, imported = done.stdout.split(" ", 1)
    assert host == "<node1>" and eval(imported) == ["cluster.backends.base", "cluster.backends.facts"]
