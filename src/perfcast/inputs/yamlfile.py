"""YAML files as perfcast reads them: plain data in the YAML 1.2 core schema, bounded.

PyYAML's ``safe_load`` constructs no Python objects, but it reads YAML 1.1: ``1:30`` is the
sexagesimal 90, ``yes``/``no``/``on``/``off`` are booleans, ``3.35e12`` (no dot) is a string, a
repeated key silently keeps the last value, an alias bomb ("billion laughs": nine levels of ten
aliases each) expands to 10⁹ nodes in whatever walks the result, and nesting a few thousand
levels deep ends in a ``RecursionError``. :func:`load_yaml` reads the same text

- through :func:`perfcast.inputs.read_text` (size limit, UTF-8, no binary);
- with the YAML 1.2 core schema's scalars only (YAML 1.2.2 §10.3.2: ``null``, ``true``/``false``,
  decimal, ``0o`` octal and ``0x`` hex integers, floats with or without a dot, ``.inf``,
  ``.nan``; everything else is a string) and no merge keys (``<<``), which YAML 1.2 dropped;
- with only the core schema's tags (``!!str !!int !!float !!bool !!null !!map !!seq``): any
  other tag, ``!!python/…`` included, is refused, never constructed;
- counting nodes as the composer builds them, every alias counted as the size of what it
  stands for, so that an alias bomb is refused before it is expanded; refusing an alias to a
  node that contains it, nesting deeper than :data:`MAX_DEPTH` and repeated keys.

Every refusal is a :class:`perfcast.ir.UserError` of one short line naming the file and line;
several repeated keys are one report, a line each.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode
from yaml.resolver import BaseResolver

from perfcast.inputs.problems import problems_error
from perfcast.inputs.text import excerpt, read_text
from perfcast.ir.errors import UserError

#: The largest YAML file perfcast reads. Shipped files are below 40 kB; a spec a user writes is
#: smaller still. libyaml (C) scans it; the composer runs in Python at about 10 µs a node, which
#: MAX_NODES bounds: a file at both limits is read or refused in about a second.
MAX_YAML_BYTES = 4 * 1024 * 1024
#: Nodes after expanding every alias (a mapping, a list, a scalar: one each). The largest
#: shipped file has 2,501.
MAX_NODES = 100_000
#: Aliases in one file. No shipped file uses one; a hand-written spec needs a few at most.
MAX_ALIASES = 100
#: Levels of nested mappings and lists. Shipped files nest at most 7 deep.
MAX_DEPTH = 64
#: How much of a parser's own message an error line keeps.
MESSAGE_CHARS = 120

_TAG = "tag:yaml.org,2002:"
# YAML 1.2.2 §10.3.2, the core schema's tag resolution.
_CORE = (
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", list("-+0123456789")),
    ("float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
     list("-+0123456789.")),
)
_PATTERNS = {kind: re.compile(f"^(?:{pattern})$") for kind, pattern, _ in _CORE}


class _CoreResolver(BaseResolver):
    """Implicit tags per the YAML 1.2 core schema (no timestamps, no sexagesimal, no merge)."""


for _kind, _pattern, _first in _CORE:
    _CoreResolver.add_implicit_resolver(_TAG + _kind, _PATTERNS[_kind], _first)


class _Composer(yaml.composer.Composer):
    """PyYAML's composer with a budget: nodes (aliases counted expanded), aliases and depth."""

    def __init__(self):
        super().__init__()
        self.nodes = 0
        self.aliases = 0
        self.depth = 0
        self.sizes: dict[str, int] = {}  # anchor → nodes under it, once it is composed

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self.anchors:
                size = self.sizes.get(event.anchor)
                if size is None:
                    raise ConstructorError(None, None, f"alias {excerpt('*' + event.anchor)} refers to a node that "
                                                       f"contains it", event.start_mark)
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise ConstructorError(None, None, f"more than {MAX_ALIASES} aliases (perfcast reads at "
                                                       f"most {MAX_ALIASES})", event.start_mark)
                self._count(size, event.start_mark)
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise ConstructorError(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        self.depth += 1
        before = self.nodes
        node = super().compose_node(parent, index)
        self.depth -= 1
        self._count(1, event.start_mark)
        if event.anchor is not None:
            self.sizes[event.anchor] = self.nodes - before
        return node

    def _count(self, n: int, mark) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise ConstructorError(None, None, f"more than {MAX_NODES:,} nodes once aliases are expanded "
                                               f"(an alias bomb?)", mark)


class _CoreConstructor(SafeConstructor):
    """Builds only the core schema's types; remembers repeated keys to report them all."""

    yaml_constructors: dict = {}

    def __init__(self):
        super().__init__()
        self.repeated: list[tuple[int, object]] = []

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, MappingNode):
            raise ConstructorError(None, None, f"expected a mapping, found a {node.id}", node.start_mark)
        mapping = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise ConstructorError(None, None, "a mapping or list as a mapping key", key_node.start_mark) from None
            if key in mapping:
                self.repeated.append((key_node.start_mark.line + 1, key))
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_core_null(self, node):
        self._scalar(node, "null")
        return None

    def construct_core_bool(self, node):
        return self._scalar(node, "bool").lower() == "true"

    def construct_core_int(self, node):
        text = self._scalar(node, "int")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        try:
            if digits.startswith(("0o", "0x")):
                return int(digits[2:], 8 if digits[1] == "o" else 16)
            return sign * int(digits)
        except ValueError:  # longer than Python's limit on digits in an integer string
            raise ConstructorError(None, None, f"an integer of {len(digits):,} digits", node.start_mark) from None

    def construct_core_float(self, node):
        text = self._scalar(node, "float")
        if text.lower().lstrip("+-") == ".inf":
            return -math.inf if text.startswith("-") else math.inf
        if text.lower() == ".nan":
            return math.nan
        return float(text)  # the pattern is a subset of what float() reads; 1e400 is inf

    def construct_undefined(self, node):
        raise ConstructorError(None, None, f"tag {excerpt(node.tag.replace(_TAG, '!!', 1))} is not plain YAML data "
                                           f"(mappings, lists, strings, numbers, booleans, null)", node.start_mark)

    def _scalar(self, node, kind: str) -> str:
        text = self.construct_scalar(node)
        if not _PATTERNS[kind].match(text):
            raise ConstructorError(None, None, f"!!{kind} {excerpt(text)} is not a YAML 1.2 {kind}", node.start_mark)
        return text


for _kind in ("null", "bool", "int", "float"):
    _CoreConstructor.add_constructor(_TAG + _kind, getattr(_CoreConstructor, f"construct_core_{_kind}"))
_CoreConstructor.add_constructor(_TAG + "str", SafeConstructor.construct_yaml_str)
_CoreConstructor.add_constructor(_TAG + "seq", SafeConstructor.construct_yaml_seq)
_CoreConstructor.add_constructor(_TAG + "map", SafeConstructor.construct_yaml_map)
_CoreConstructor.add_constructor(None, _CoreConstructor.construct_undefined)


class _PyParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    def __init__(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


def _loader_class(parser: type) -> type:
    # The composer comes before the parser: a C parser's own composer would neither count nor
    # limit what it builds.
    class Loader(_Composer, parser, _CoreConstructor, _CoreResolver):
        def __init__(self, stream):
            parser.__init__(self, stream)
            _Composer.__init__(self)
            _CoreConstructor.__init__(self)
            _CoreResolver.__init__(self)

    return Loader


try:  # libyaml's parser (C) when PyYAML was built with it: the same events, ten times faster
    from yaml._yaml import CParser
except ImportError:
    CParser = _PyParser
_LOADER = _loader_class(CParser)


def parse_yaml(text: str, where: str | Path) -> object:
    """The data of one YAML document ``text`` read from ``where`` (None for an empty one); a
    :class:`UserError` naming ``where`` and the line for anything :func:`load_yaml` refuses."""
    loader = None
    try:
        loader = _LOADER(text)
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" at line {mark.line + 1}" if mark is not None else ""
        what = _cut(": ".join(m for m in (e.context, e.problem) if m) or "unreadable")
        if isinstance(e, ConstructorError):  # well-formed YAML that perfcast refuses to build
            raise UserError(f"{where}: line {mark.line + 1}: {what}" if mark else f"{where}: {what}") from None
        raise UserError(f"{where}: not valid YAML{line}: {what}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow, at a character offset
        line = text.count("\n", 0, e.position) + 1
        raise UserError(f"{where}: not valid YAML at line {line}: {_cut(str(e).splitlines()[0])}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{where}: not valid YAML: {_cut(str(e).splitlines()[0])}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader.repeated:
        raise problems_error(where, [f"line {line}: key {excerpt(key)} given twice (YAML keeps only the last; "
                                     f"remove one)" for line, key in sorted(loader.repeated, key=lambda r: r[0])])
    return data


def load_yaml(path: Path | str, *, limit_bytes: int = MAX_YAML_BYTES) -> object:
    """The data of the YAML file ``path`` (see the module docstring for what is refused)."""
    return parse_yaml(read_text(path, limit_bytes=limit_bytes), path)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting a string that either YAML 1.1 or the 1.2 core schema would
    read as something else (``1e5``, ``0o17`` as well as ``yes``, ``1:30``)."""


for _kind in ("int", "float"):
    _Dumper.add_implicit_resolver(_TAG + _kind, _PATTERNS[_kind], next(f for k, _, f in _CORE if k == _kind))


def dump_yaml(data: object, **options) -> str:
    """``data`` as YAML text that :func:`load_yaml` reads back unchanged (``options``: those of
    ``yaml.safe_dump``)."""
    return yaml.dump(data, Dumper=_Dumper, **options)


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "…"
