"""The unlearning methods by name and setting, without importing them (they import torch): what the
command line checks ``process --method`` and ``benchmark --methods`` against before a server or a
flow starts. Read from the methods' own files as text (each ``@register``ed class's ``name`` and
``settings``), so a new method's file is all it takes; tests/test_cli_startup.py holds this table to
the registry (``fedunlearn.unlearning.available_methods``)."""

from __future__ import annotations

import ast
from pathlib import Path

from fedunlearn.errors import InputError

AUTO = "auto"  # process-deletions' default: the setting's and request kind's own method
def _literal(node: ast.ClassDef, attribute: str, classes: dict[str, ast.ClassDef]) -> object:
    """A class attribute's literal value as the source writes it (``frozenset({...})`` as its set),
    looked up through the bases defined in the same file; None where none is written."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == attribute for t in statement.targets):
            value = statement.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "frozenset" and value.args:
                value = value.args[0]
            return ast.literal_eval(value)
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            return _literal(classes[base.id], attribute, classes)
    return None


def _declared_methods() -> dict[str, tuple[str, ...]]:
    """Each ``@register``ed class under fedunlearn/unlearning/ by its ``name`` and ``settings``, read
    from the source as text: the method's own file is the one place it is declared."""
    found: dict[str, set[str]] = {}
    for path in sorted((Path(__file__).parent / "unlearning").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in classes.values():
            if any(getattr(d, "id", None) == "register" for d in node.decorator_list):
                name, settings = _literal(node, "name", classes), _literal(node, "settings", classes)
                found.setdefault(str(name), set()).update(settings or ())
    return {name: tuple(sorted(settings)) for name, settings in sorted(found.items())}


METHOD_SETTINGS: dict[str, tuple[str, ...]] = _declared_methods()


def methods_for(setting: str) -> list[str]:
    return [name for name, settings in METHOD_SETTINGS.items() if setting in settings]


def require_method(name: str, setting: str, scenario: str) -> None:
    """``name`` is ``auto`` or a method that unlearns in ``setting``, else one line naming those that do."""
    if name == AUTO:
        return
    usable = ", ".join([AUTO, *methods_for(setting)])
    if name not in METHOD_SETTINGS:
        raise InputError(f"unknown method {name!r}; for {scenario} ({setting}) choose one of {usable}")
    if setting not in METHOD_SETTINGS[name]:
        raise InputError(f"method {name!r} does not unlearn in {setting} ({scenario} is {setting}); choose one of "
                         f"{usable}")


def require_methods(listing: str, setting: str, scenario: str) -> None:
    """A comma-separated list (``benchmark --methods``) of methods for ``setting``, or ``all``."""
    if listing.strip() == "all":
        return
    names = [m.strip() for m in listing.split(",") if m.strip()]
    wrong = [m for m in names if setting not in METHOD_SETTINGS.get(m, ())]
    if not names or wrong:
        raise InputError(f"--methods {listing!r}: {', '.join(repr(m) for m in wrong) or 'no method named'}"
                         f" {'is' if len(wrong) == 1 else 'are'} not a method for {scenario} ({setting}); "
                         f"choose 'all' or from {', '.join(methods_for(setting))}")
