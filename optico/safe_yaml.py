"""YAML for specs: PyYAML's SafeLoader with bounds, so a hostile file fails fast, naming the line.

SafeLoader already refuses arbitrary Python objects. What it does not bound, and what this
loader does, all before a single Python object is built:
- depth: the composer recurses per level, so 20,000 nested lists end in RecursionError;
- size after alias expansion ("billion laughs"): a 600-byte document whose aliases expand to
  billions of nodes costs nothing to parse but everything to validate or store as JSON;
  recursive aliases (`&a [*a]`) are refused the same way;
- types: only what JSON has (strings, integers, finite floats, booleans, null, lists and
  mappings with string keys), so a spec always stores and round-trips; "1e-05" is a float, as in
  YAML 1.2 and JSON (YAML 1.1 reads an exponent without a dot as a string); `2024-01-01` stays a
  string, `!!binary`, `!!set` and custom tags are refused;
- duplicate keys, which YAML forbids but PyYAML resolves silently (the last one wins);
- YAML 1.1's surprises, which YAML 1.2 dropped: octal by a leading zero (`01000` is 512), binary (`0b11`), base 60
  (`1:30` is 90), booleans spelled `yes`/`no`/`on`/`off`;
- magnitudes: integer literals beyond 64 bits, strings beyond `MAX_SCALAR_CHARS`, NUL
  characters (no path, argument or environment value may hold one).
Every refusal is a `yaml.MarkedYAMLError`, so callers report it like a syntax error.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 32
MAX_NODES = 20_000  # after alias expansion; a full spec has a few hundred
MAX_EXPANDED_CHARS = 1 << 20  # characters of all scalars, after alias expansion
MAX_SCALAR_CHARS = 16_384
MAX_INT_DIGITS = 19  # 64-bit integers

_TAG = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge"))


# The node each allowed tag goes on (scalar tags on scalars): `!!map x` or `!!map [1]` crashed the constructor.
_NODE_KIND: dict[str, type[Node]] = {_TAG + "map": MappingNode, _TAG + "seq": SequenceNode}
_KIND_NAME = {ScalarNode: "a scalar", SequenceNode: "a list", MappingNode: "a mapping"}

_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = yaml.constructor.SafeConstructor()  # reads a tagged scalar as YAML does, for the checks
_TAGGED_KINDS = {_TAG + "int": "int", _TAG + "float": "float", _TAG + "bool": "bool"}
_KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false"}
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")
_BINARY = re.compile(r"^[-+]?0b", re.IGNORECASE)
_YAML11_BOOLS = frozenset({"yes", "no", "on", "off", "y", "n"})


class YamlLimitError(yaml.MarkedYAMLError):
    """The document breaks one of this module's bounds; `field` is the dotted path of the value that
    does ('workload.seq_length'), where one is known."""

    field: str | None = None


def _refuse(problem: str, node_or_mark: Any, path: tuple[str, ...] | None = None) -> YamlLimitError:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    error = YamlLimitError(problem=problem, problem_mark=mark)
    error.field = ".".join(path) if path else None
    return error


def _scalar_problem(node: ScalarNode) -> str | None:
    """What is wrong with a scalar's value as resolved (`check_graph` asks before anything is built).
    Normalizes on the way: a JSON pair of escaped surrogates becomes its character (`_joined`)."""
    if len(node.value) > MAX_SCALAR_CHARS:
        return f"a value longer than {MAX_SCALAR_CHARS} characters"
    if "\x00" in node.value:
        return "a value holds a NUL character"
    node.value = _joined(node.value)
    if _SURROGATE.search(node.value):  # "\ud800": no encoder (terminal, SQLite, JSON) takes it
        return "a value holds a lone surrogate (not a Unicode character)"
    if node.tag in (_TAG + "int", _TAG + "float") and ":" in node.value:
        # YAML 1.1's base 60 ("1:30" is 90, "1:30.5" is 90.5): a surprise, and unbounded by digits
        return f"{node.value[:30]!r} is a base-60 number; write the number (or quote a string)"
    if node.tag in (_TAG + "int", _TAG + "float") and "_" in node.value:
        # YAML 1.1 drops underscores ("6_4" is 64, "1___0" is 10); YAML 1.2 and JSON read no such number
        return f"{node.value[:30]!r} has underscores, which YAML 1.1 drops; write the number without them " \
               f"(or quote a string)"
    if node.tag == _TAG + "int":
        if _BINARY.match(node.value):  # YAML 1.1 only: "0b11" is 3 there, a string to YAML 1.2 and JSON
            return f"{node.value[:30]!r} is a YAML 1.1 binary number; write the number in decimal (or quote a " \
                   f"string)"
        if _LEADING_ZERO.match(node.value):  # YAML 1.1 reads "01000" as octal: 512
            return f"{node.value[:30]!r} has a leading zero, which YAML 1.1 reads as octal; write the number " \
                   f"without it (or quote a string)"
        if sum(c.isalnum() for c in node.value) > MAX_INT_DIGITS:
            return f"integer {node.value[:30]!r}... is too large"
    if node.tag == _TAG + "bool" and node.value.lower() in _YAML11_BOOLS:
        # YAML 1.1's other spellings: "yes", "no", "on", "off" (a country code "NO" is false)
        return f"{node.value[:30]!r} is a YAML 1.1 boolean; write true or false (or quote a string)"
    kind = _TAGGED_KINDS.get(node.tag)
    if kind is not None:
        try:  # an explicit tag on text it cannot read (`!!bool maybe`, `!!int` alone) raised a KeyError
            value = getattr(_SCALARS, f"construct_yaml_{kind}")(node)
        except (ValueError, KeyError, IndexError, TypeError):
            return f"{node.value[:30]!r} is not {_KIND_WORDS[kind]}"
        if kind == "float" and not math.isfinite(value):
            return f"{node.value[:30]!r} is not a finite number"
    return None


def _joined(text: str) -> str:
    """`text` with each pair of surrogates joined into the character it encodes: JSON writes a
    character beyond the BMP as two escapes ("\ud83e\udd99", as json.dumps does), which YAML reads as
    two surrogates. A lone one stays (and is refused)."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


class BoundedSafeLoader(yaml.SafeLoader):
    """SafeLoader with the module's bounds; use `load_yaml`."""

    # No implicit timestamps: a date-looking value stays the string it was written as.
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TAG + "timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        # Bounded here, while composing, because the composer recurses once per level.
        self._depth += 1
        self._composed += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _refuse(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            if self._composed > MAX_NODES:
                raise _refuse(f"more than {MAX_NODES} values", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _TAG + "merge":
                continue  # `<<: *defaults`: merged keys may be overridden, that is its purpose
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise _refuse(f"mapping keys must be strings, got {type(key).__name__} {key!r} (quote it)",
                              key_node)
            if key in seen:
                raise _refuse(f"duplicate key {key!r}", key_node)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Exponent floats without a dot ("1e-05", "2E+3"): a string to YAML 1.1, a number to YAML 1.2 and to
# JSON — which writes small floats this way (Python's json.dumps(0.00001) is "1e-05"), and a JSON
# body is read by this loader too.
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
BoundedSafeLoader.add_implicit_resolver(_TAG + "float", _EXPONENT_FLOAT, list("-+0123456789"))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _named_children(node: Node, path: tuple[str, ...]) -> list[tuple[Node, tuple[str, ...]]]:
    """The children with the path of each: a mapping's value under its key, an item under its index."""
    if isinstance(node, SequenceNode):
        return [(child, (*path, str(i))) for i, child in enumerate(node.value)]
    if isinstance(node, MappingNode):
        out: list[tuple[Node, tuple[str, ...]]] = []
        for key, value in node.value:
            name = _joined(key.value)[:60] if isinstance(key, ScalarNode) and isinstance(key.value, str) else "?"
            out += [(key, path), (value, (*path, name if not _SURROGATE.search(name) else ascii(name)))]
        return out
    return []


def check_graph(root: Node) -> None:
    """Refuses disallowed tags, bad scalars, recursive aliases and a document whose expansion
    exceeds the bounds, without expanding it: sizes are summed over the node graph, each
    shared (aliased) node counted once per reference but computed once."""
    size: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, scalar characters) when expanded
    open_path: set[int] = set()  # nodes started and not finished: the current DFS path
    stack: list[tuple[Node, bool, tuple[str, ...]]] = [(root, False, ())]
    while stack:
        node, finished, path = stack.pop()
        key = id(node)
        if finished:
            nodes, chars = 1, len(node.value) if isinstance(node, ScalarNode) else 0
            for child in _children(node):
                n, c = size[id(child)]
                nodes, chars = nodes + n, chars + c
            if nodes > MAX_NODES:
                raise _refuse(f"expands to more than {MAX_NODES} values (aliases included)", node)
            if chars > MAX_EXPANDED_CHARS:
                raise _refuse(f"expands to more than {MAX_EXPANDED_CHARS} characters (aliases included)", node)
            size[key] = (nodes, chars)
            open_path.discard(key)
            continue
        if key in size:
            continue
        if key in open_path:
            raise _refuse("an alias refers to a value that contains it (recursive alias)", node)
        if node.tag not in ALLOWED_TAGS:
            raise _refuse(f"tag {node.tag!r} is not allowed (strings, numbers, booleans, null, lists and "
                          f"mappings only)", node, path)
        if not isinstance(node, _NODE_KIND.get(node.tag, ScalarNode)):
            raise _refuse(f"the !!{node.tag.removeprefix(_TAG)} tag cannot go on {_KIND_NAME[type(node)]}", node, path)
        if isinstance(node, ScalarNode):
            problem = _scalar_problem(node)
            if problem:
                raise _refuse(problem, node, path)
        open_path.add(key)
        stack.append((node, True, path))
        # Reversed onto the stack, so that children are checked in document order (an anchor before its aliases).
        stack.extend((child, False, where) for child, where in reversed(_named_children(node, path))
                     if id(child) not in size)


def load_yaml(text: str) -> Any:
    """The one document in `text` as plain JSON-like data (None for an empty document).
    Raises yaml.YAMLError (a MarkedYAMLError with a line for every bound) on bad input."""
    loader = BoundedSafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_graph(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
