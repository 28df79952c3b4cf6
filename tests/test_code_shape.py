"""The code's shape, checked like the layer contracts: no function or method over 60 lines outside
tests/ and scripts/ (docstrings and comments count: a function that needs more is two functions); no
assignment into another package, no pickle reducer, no use of another package's private names."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "flows", "tasks", "stores", "runtime", "fedunlearn", "fedunlearn_flower", "models")
MAX_LINES = 60
# The orchestration dependencies the pipeline must survive upgrades of: their private names are off limits.
ORCHESTRATION = ("prefect", "mlflow", "dvc", "great_expectations")


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_is_over_60_lines():
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50  # the packages were found
    assert [f for path in files for f in long_functions(path)] == []


def test_no_issue_number_in_the_code():
    """History lives in CHANGELOG.md and git: a comment or docstring says why, not which issue asked."""
    import re

    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    pattern = re.compile(r"\bissues? \d+", re.IGNORECASE)
    assert [f"{p.relative_to(ROOT)}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)] == []


def module_caches(source: str) -> list[str]:
    """Module-level names bound to an empty dict, list or set: state a process would keep between runs."""
    def empty(value) -> bool:
        if isinstance(value, ast.Dict):
            return not value.keys
        if isinstance(value, (ast.List, ast.Set)):
            return not value.elts
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.args
                and value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict"))

    found = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if targets and getattr(node, "value", None) is not None and empty(node.value):
            found += [f"{target.id} (line {node.lineno})" for target in targets if isinstance(target, ast.Name)]
    return found


def test_no_module_level_cache_in_the_flows_or_tasks():
    """A batch's state travels in its values (``flows.batch``), not in a module's memory."""
    files = [p for package in ("flows", "tasks") for p in sorted((ROOT / package).rglob("*.py"))]
    assert {f"{path.relative_to(ROOT)}: {name}" for path in files for name in module_caches(path.read_text())} \
        == set()
    assert module_caches("_CAPTURED: dict[str, int] = {}\nSEEN = set()\nNAMES = {'a': 1}\n") == [
        "_CAPTURED (line 1)", "SEEN (line 2)"]


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

def imported_elsewhere(tree: ast.Module) -> dict[str, str]:
    """Names bound by imports of packages other than this project's (modules, classes, functions),
    each with what it names (``module`` or ``module.attribute``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update({(a.asname or a.name).split(".")[0]: a.name.split(".")[0] if not a.asname else a.name
                          for a in node.names if a.name.split(".")[0] not in PACKAGES})
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] not in PACKAGES:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return names


def overridden_private(base: str, method: str) -> bool:
    """The class ``base`` (``module.Class``) has ``method``, a private one: a subclass overrides it."""
    module, _, name = base.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return is_private(method) and isinstance(cls, type) and hasattr(cls, method)


def root_name(node: ast.AST) -> str | None:
    """``a`` of ``a.b[c].d``."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def foreign_uses(path: Path) -> list[str]:
    """Assignments to an attribute of something imported from another package, pickle reducers
    (``copyreg``), imports and reads of another package's private names, and overrides of its
    classes' private methods."""
    tree = ast.parse(path.read_text(), filename=str(path))
    foreign, found = imported_elsewhere(tree), []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and root_name(target) in foreign:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} assigns into {root_name(target)}")
        if (isinstance(node, ast.Attribute) and is_private(node.attr)
                and foreign.get(root_name(node), "").split(".")[0] in ORCHESTRATION):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {root_name(node)}...{node.attr}, a private name")
        if isinstance(node, ast.ClassDef):
            bases = [foreign[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in foreign]
            found += [f"{path.relative_to(ROOT)}:{item.lineno} overrides {item.name}, a private method of {base}"
                      for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for base in bases if overridden_private(base, item.name)]
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
    ("from prefect.server.api.server import SubprocessASGIServer\nSubprocessASGIServer._instances[None] = 1\n",
     "a private name"),
    ("from prefect.server.api.server import SubprocessASGIServer as S\nclass Mine(S):\n"
     "    def _run_uvicorn_command(self):\n        pass\n", "overrides _run_uvicorn_command"),
])
def test_the_check_finds_a_patch_a_reducer_and_a_private_import(tmp_path, source, found):
    sample = ROOT / "tests" / f"_foreign_probe_{tmp_path.name}.py"
    sample.write_text(source)
    try:
        [message] = foreign_uses(sample)
    finally:
        sample.unlink()
    assert found in message
