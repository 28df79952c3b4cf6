"""Safe defaults (issue #10), checked on the project's own source: weights are only ever loaded
with ``weights_only=True``, nothing is unpickled, and every server the project starts binds
127.0.0.1."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for folder in ("fedunlearn", "tasks", "flows", "cli", "models", "scripts")
                 for p in (ROOT / folder).rglob("*.py"))
UNPICKLING = {("pickle", "load"), ("pickle", "loads"), ("cloudpickle", "load"), ("cloudpickle", "loads"),
              ("joblib", "load"), ("dill", "load"), ("dill", "loads"), ("numpy", "load")}


def calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Call)]


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def keyword(call: ast.Call, name: str):
    found = [k.value for k in call.keywords if k.arg == name]
    return found[0] if found else None


def test_every_torch_load_is_weights_only_and_nothing_is_unpickled(reliability_report):
    loads, problems = 0, []
    for path in SOURCES:
        for call in calls(path):
            name = dotted(call.func)
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            if name == "torch.load":
                loads += 1
                flag = keyword(call, "weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    problems.append(f"{where}: torch.load without weights_only=True")
            module, _, function = name.rpartition(".")
            module = {"np": "numpy"}.get(module.split(".")[-1], module.split(".")[-1])
            if (module, function) not in UNPICKLING:
                continue
            allow = keyword(call, "allow_pickle")
            if module != "numpy" or (isinstance(allow, ast.Constant) and allow.value is True):
                problems.append(f"{where}: {name} can unpickle")  # np.load refuses pickles unless allowed
    assert loads >= 2 and not problems, problems
    reliability_report.count("weight loads checked (weights_only=True)", loads)


def test_servers_the_project_starts_bind_localhost():
    script = (ROOT / "scripts" / "serve.sh").read_text()
    starts = [line for line in script.splitlines()
              if not line.lstrip().startswith("#") and re.search(r"\b(server start|mlflow\"? (ui|server))\b", line)]
    assert len(starts) == 2 and all("--host 127.0.0.1" in line for line in starts), starts
    assert "0.0.0.0" not in script
