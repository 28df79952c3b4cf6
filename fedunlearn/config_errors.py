"""A pydantic ``ValidationError`` of params.yaml as one line a user can act on: each wrong value by
its key path (``scenarios.digits-hfl.train.lr``), what it should be — the allowed range, the keys
allowed where an unknown one stands, the close match of a mistyped one — and no pydantic URL."""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

SHOWN_ERRORS = 3  # beyond these, a count: the line stays readable
_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", "≥"), (annotated_types.Lt, "lt", "<"),
           (annotated_types.Le, "le", "≤"))
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_TYPE_WORDS = {"int_type": "an integer", "int_from_float": "an integer", "float_type": "a number",
               "bool_type": "true or false", "string_type": "a text", "finite_number": "a finite number",
               "dict_type": "a mapping (key: value)", "list_type": "a list", "model_type": "a mapping (key: value)"}


def describe_validation(err: ValidationError, model: type[BaseModel], patterns: dict[str, str] | None = None) -> str:
    """``err`` (raised validating ``model``) in one line: at most ``SHOWN_ERRORS`` problems, then a count.
    ``patterns``: what a text that fails a pattern should be, by pattern (pydantic shows the regex)."""
    problems = [describe_error(error, model, patterns or {}) for error in err.errors(include_url=False)]
    more = len(problems) - SHOWN_ERRORS
    return "; ".join(problems[:SHOWN_ERRORS]) + (f" (and {more} more)" if more > 0 else "")


def describe_error(error: dict[str, Any], model: type[BaseModel], patterns: dict[str, str]) -> str:
    loc = tuple(error["loc"])
    kind, value = error["type"], error.get("input")
    if loc[-1:] == ("[key]",):  # a dict's key (a scenario's name): the path is its parent's
        loc = loc[:-2]
    key = ".".join(str(part) for part in loc) or "the file"
    if kind == "extra_forbidden":
        return _unknown_key(key, loc, model)
    if kind == "missing":
        return f"{key} is missing: it is required"
    if kind in _RANGE_ERRORS:
        return f"{key}: {_shown(value)} is out of range; allowed: {_range(loc, model) or error['msg']}"
    if kind in _TYPE_WORDS:
        quoted = " (write it without quotes)" if kind != "string_type" and _looks_typed(value) else ""
        return f"{key}: {_shown(value)} is not {_TYPE_WORDS[kind]}{quoted}"
    if kind == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") in patterns:
        return f"{key}: {_shown(value)} {patterns[error['ctx']['pattern']]}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message}" if kind == "value_error" else f"{key}: {_shown(value)}: {message}"


def _unknown_key(key: str, loc: tuple, model: type[BaseModel]) -> str:
    where = _type_at(loc[:-1], model)
    if not (isinstance(where, type) and issubclass(where, BaseModel)):
        return f"{key} is not a known key"
    allowed = list(where.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{key} is not a known key: {hint}allowed here: {', '.join(allowed)}"


def _range(loc: tuple, model: type[BaseModel]) -> str:
    """The field's bounds, both sides (pydantic's message names only the one crossed)."""
    parent = _type_at(loc[:-1], model)
    if not (isinstance(parent, type) and issubclass(parent, BaseModel)) or loc[-1] not in parent.model_fields:
        return ""
    info = parent.model_fields[loc[-1]]
    metadata = list(info.metadata) + [m for arg in get_args(info.annotation) for m in getattr(arg, "__metadata__", ())]
    metadata += [inner for m in metadata if isinstance(m, FieldInfo) for inner in m.metadata]
    return " and ".join(f"{sign} {getattr(m, name)}" for m in metadata for cls, name, sign in _BOUNDS
                        if isinstance(m, cls))


def _type_at(loc: tuple, model: type) -> Any:
    """The type a key path leads to inside ``model``; None where the path leaves what the annotations say."""
    current: Any = model
    for part in loc:
        current = _unwrapped(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            current = field.annotation
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        elif get_origin(current) is list and isinstance(part, int):
            current = get_args(current)[0]
        else:
            return None
    return _unwrapped(current)


def _unwrapped(annotation: Any) -> Any:
    """``X`` for ``Annotated[X, ...]`` and ``X | None``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _looks_typed(value: Any) -> bool:
    """A text that YAML would have read as a number or a boolean without its quotes."""
    if not isinstance(value, str):
        return False
    if value.strip().lower() in ("true", "false"):
        return True
    try:
        float(value)
    except ValueError:
        return False
    return True


def _shown(value: Any) -> str:
    """The value as YAML spells it where that differs from Python (true, null)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
