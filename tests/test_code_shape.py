"""The code's shape, checked like the layer contracts: no function or method over 60 lines outside
tests/ and scripts/ (docstrings and comments count: a function that needs more is two functions); no
assignment into another package, no pickle reducer, no import of another module's private names."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "flows", "tasks", "stores", "runtime", "fedunlearn", "models")
MAX_LINES = 60


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_is_over_60_lines():
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50  # the packages were found
    assert [f for path in files for f in long_functions(path)] == []


def test_the_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    sample = ROOT / "tests" / f"_shape_probe_{tmp_path.name}.py"
    sample.write_text(f"def too_long():\n{body}\n")
    try:
        [found] = long_functions(sample)
    finally:
        sample.unlink()
    assert "too_long" in found and f"({MAX_LINES + 1} lines)" in found


# --- public APIs only (issue 27): nothing assigned into another package, no reducers, no private names

def imported_elsewhere(tree: ast.Module) -> set[str]:
    """Names bound by imports of packages other than this project's (modules, classes, functions)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] not in PACKAGES}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] not in PACKAGES:
            names |= {a.asname or a.name for a in node.names}
    return names


def foreign_uses(path: Path) -> list[str]:
    """Assignments to an attribute of something imported from another package, pickle reducers
    (``copyreg``), and imports of another module's private names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    foreign, found = imported_elsewhere(tree), []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            root = target
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in foreign:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} assigns into {root.id}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names]
            if "copyreg" in names or module == "copyreg":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports copyreg")
            if module and any(n.startswith("_") and not n.startswith("__") for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports a private name of {module}")
    return found


def test_no_module_patches_another_package_or_reaches_for_private_names():
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert [f for path in files for f in foreign_uses(path)] == []


@pytest.mark.parametrize("source, found", [
    ("from prefect import flow_engine\nflow_engine.multiprocessing = None\n", "assigns into flow_engine"),
    ("import ssl\nimport prefect.client.orchestration as o\no.ssl = ssl\n", "assigns into o"),
    ("import copyreg\n", "imports copyreg"),
    ("from stores.workspace import _run_dvc\n", "imports a private name"),
])
def test_the_check_finds_a_patch_a_reducer_and_a_private_import(tmp_path, source, found):
    sample = ROOT / "tests" / f"_foreign_probe_{tmp_path.name}.py"
    sample.write_text(source)
    try:
        [message] = foreign_uses(sample)
    finally:
        sample.unlink()
    assert found in message
