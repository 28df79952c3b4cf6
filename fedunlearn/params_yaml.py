"""``params.yaml`` parsed with bounds: YAML's aliases can make a 1 KB file stand for gigabytes
("billion laughs"), its nesting can exhaust Python's recursion, and a key written twice silently
keeps the second value. Here aliases count as everything they stand for, nesting is capped, a
repeated key is refused naming both lines, and a syntax error names the line where the faulty
text starts rather than the one where the parser noticed it."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

import yaml

# params.yaml nests five levels; the cap only stops a hostile file before Python's recursion does.
MAX_DEPTH = 32
# Values once aliases are expanded (the project's params.yaml holds a few hundred; pure-Python YAML
# reads some tens of thousands a second, so the cap also bounds the time a hostile file costs).
MAX_VALUES = 20_000
MERGE_TAG = "tag:yaml.org,2002:merge"


class Refused(yaml.MarkedYAMLError):
    """Valid YAML past a bound, or a key given twice: the message says what to change."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the bounds above, and the last scalars it scanned kept (where a
    syntax error really starts)."""

    def __init__(self, stream: bytes | str):
        super().__init__(stream)
        self._depth = 0
        self._values: dict[int, int] = {}  # id(node) -> the values it stands for, aliases expanded
        self._total = 0  # values composed so far, each alias counted as its whole value
        self.recent_scalars: deque[yaml.Token] = deque(maxlen=4)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) not in self._values:  # an alias inside its own anchor
                raise Refused(None, None, f"the alias *{event.anchor} refers to a value that contains it; write the "
                              "value out instead", event.start_mark)
            if target is not None:
                self._count(self._values[id(target)], event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise Refused(None, None, f"values are nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._values[id(node)] = 1 + sum(self._values[id(child)] for child in _children(node))
        self._count(1, node.start_mark)
        return node

    def _count(self, values: int, mark) -> None:
        self._total += values
        if self._total > MAX_VALUES:
            raise Refused(None, None, f"the file holds more than {MAX_VALUES} values once its aliases (*name) are "
                          "expanded; write fewer values, and aliases only of small ones", mark)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:  # `<<: *base` then a key overriding it is what merging is for
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first_line.get(key)
                except TypeError:  # a key that cannot be hashed: SafeConstructor says so below
                    continue
                if seen is not None:
                    raise Refused(None, None, f"the key {key!r} is given twice (first at line {seen + 1}): keep one",
                                  key_node.start_mark)
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def fetch_flow_collection_start(self, TokenClass):
        # Here, not only in compose_node: the scanner keeps a possible key per open bracket and scans
        # them all for each token, so 5,000 '[' cost seconds before the composer sees one.
        if self.flow_level >= MAX_DEPTH:
            raise Refused(None, None, f"values are nested deeper than {MAX_DEPTH} levels", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def scan_plain(self):
        return self._kept(super().scan_plain())

    def scan_flow_scalar(self, style):
        return self._kept(super().scan_flow_scalar(style))

    def _kept(self, token):
        self.recent_scalars.append(token)
        return token


# YAML 1.2 (and DVC, which reads params.yaml too) reads 1e3 as a number; PyYAML's YAML 1.1 reads it as
# text unless it has a dot and a signed exponent (1.0e+3).
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                    list("-+0123456789"))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


@dataclass(frozen=True)
class YamlProblem:
    """Where a YAML error lies (1-based) and what it is; ``noticed_line`` where the parser found it,
    when that is a later line."""

    line: int | None
    column: int | None
    problem: str
    noticed_line: int | None = None
    syntax: bool = True  # False: valid YAML refused (a bound, a repeated key)

    def __str__(self) -> str:
        where = "an unknown place" if self.line is None else f"line {self.line}, column {self.column}"
        later = f" (YAML noticed it at line {self.noticed_line})" if self.noticed_line else ""
        return f"{where}: {self.problem}{later}"


def load_bounded(text: bytes | str):
    """The YAML document ``text`` holds; ``YamlSyntax`` saying where it fails otherwise."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise YamlSyntax(locate(err, loader)) from None
    finally:
        loader.dispose()


class YamlSyntax(ValueError):
    def __init__(self, problem: YamlProblem):
        super().__init__(str(problem))
        self.problem = problem


def locate(err: yaml.YAMLError, loader: BoundedLoader) -> YamlProblem:
    """The start of what went wrong: the bracket a flow collection left open, or a scalar that ran on
    past its line (a missing ':' or closing quote) — YAML's own mark is where it gave up, often lines
    later, past comments."""
    problem = " ".join(str(part) for part in (getattr(err, "context", None), getattr(err, "problem", None))
                       if part) or str(err)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if isinstance(err, Refused):
        return YamlProblem(mark.line + 1, mark.column + 1, problem, syntax=False)
    if mark is None:
        return YamlProblem(None, None, problem)
    context, opened = getattr(err, "context", None) or "", getattr(err, "context_mark", None)
    start = None
    if context.startswith("while parsing a flow") and opened is not None:
        start = opened
        problem = f"the bracket opened here is not closed ({problem})"
    else:
        ran_on = [t for t in loader.recent_scalars
                  if t.start_mark.index < mark.index and t.start_mark.line < mark.line <= t.end_mark.line]
        if ran_on:
            start = ran_on[-1].start_mark
            problem = (f"the text starting here runs on to line {mark.line + 1}, column {mark.column + 1} (a ':' or "
                       f"closing quote missing here, or line {mark.line + 1} indented too far): {problem}")
    if start is None or start.line == mark.line:
        return YamlProblem(mark.line + 1, mark.column + 1, problem)
    return YamlProblem(start.line + 1, start.column + 1, problem, noticed_line=mark.line + 1)
