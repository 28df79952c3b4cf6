"""The code's shape, checked like the layer contracts: no function or method over 60 lines outside
tests/ and scripts/ (docstrings and comments count: a function that needs more is two functions)."""

import ast
from pathlib import Path

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
