"""Every ``import``/``from ... import`` of the kit's own modules, in the runtime packages,
resolves: at module level and inside functions (imported on use, so a broken one hides until
its path runs: ``cluster/report.py``'s GPU benchmark imported a function an earlier commit had
removed, and only a machine with CUDA would have found out)."""

import ast
import importlib
import importlib.util
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("cluster", "train")


def unresolved(path: Path) -> list[str]:
    """The kit imports in ``path`` that do not resolve: 'line N: from M import X'."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in PACKAGES:
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
                if alias.name.split(".")[0] in PACKAGES and importlib.util.find_spec(alias.name) is None:
                    bad.append(f"line {node.lineno}: import {alias.name}")
    return bad


def test_every_kit_import_in_the_runtime_packages_resolves():
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(files) > 40
    broken = {str(p.relative_to(ROOT)): bad for p in files if (bad := unresolved(p))}
    assert not broken, broken


def test_a_broken_import_inside_a_function_is_found(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "from cluster.spec import JobSpec\n\n"
        "def gpu_path():\n    from cluster.submit import as_overrides\n    import train.no_such_module\n"
    )
    assert unresolved(source) == [
        "line 4: from cluster.submit import as_overrides",
        "line 5: import train.no_such_module",
    ]
