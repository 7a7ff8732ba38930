"""A capture as a JSON document, and back, without ever running what the document says.

What the capture cache stores (:mod:`perfcast.capture.cache`). A pickle would rebuild any object
its bytes name, so loading a foreign one runs its code; this format can only describe the data a
:class:`~perfcast.capture.types.Capture` holds:

- **Expressions** (tensor dims, SymPy scalars, symbols, guards) are a table of nodes. A node
  names one type of a fixed set — ``Integer``, ``Rational``, ``Symbol`` (with its assumptions),
  ``Add``, ``Mul``, ``Pow``, ``Max``, ``Min``, ``floor``, ``ceiling``, ``Mod``, the six
  relations, ``And``, ``Or``, ``Not``, ``true``, ``false`` — and refers to its arguments by
  their index in the table, always an earlier one: decoding is one pass in order, with no
  recursion and no cycles. Strings are never parsed as expressions (no ``sympify``, ``eval``
  or ``srepr``).
- **Tensors** (``TensorMeta``) are a second table; records name them by index.
- **Scalars** are JSON's null, booleans, integers, finite floats and strings; an expression is
  ``{"expr": i}`` and a non-finite float ``{"float": "-inf"}`` (the document is strict JSON).

Decoding checks every field's type and rebuilds each node with SymPy's own constructor,
unevaluated: the arguments of what the encoder wrote are already in SymPy's form and order, so
the node is the one captured, and a crafted node cannot make SymPy work for seconds (evaluating
``floor`` or ``Eq`` of a deep sum asks its assumptions system). A node whose value could exceed
:data:`MAX_BITS` bits when its symbols are sizes below 2⁶⁴, or that spans more than
:data:`MAX_TREE` nodes or :data:`MAX_DEPTH` levels, is refused, so substituting a point and
evaluating stays cheap; so is a power of a number or a modulus that is not a positive integer
(SymPy never leaves the first unevaluated; the second could divide by zero). Anything else wrong
is :class:`Invalid`.
"""

from __future__ import annotations

import math

import sympy

from perfcast.capture.types import Capture, LayerGroup, OpRecord, TensorMeta

#: the value of one expression, with every symbol a size below 2**64, stays below 2**MAX_BITS
MAX_BITS = 2048
#: nodes of one expression counted as a tree (a shared argument counts each time it is used), and
#: its depth; the catalog's captures reach 5 and 3
MAX_TREE = 256
MAX_DEPTH = 16
SYMBOL_BITS = 64
MAX_NAME_CHARS = 200

#: SymPy's assumption names (``Symbol(name, integer=True, positive=True)``)
ASSUMPTIONS = frozenset(
    "algebraic antihermitian commutative complex composite even extended_negative "
    "extended_nonnegative extended_nonpositive extended_nonzero extended_positive extended_real "
    "finite hermitian imaginary infinite integer irrational negative noninteger nonnegative "
    "nonpositive nonzero odd polar positive prime rational real transcendental zero".split())

#: node name → SymPy type: the only functions a document may name
FUNCTIONS = {
    "Add": sympy.Add, "Mul": sympy.Mul, "Pow": sympy.Pow, "Max": sympy.Max, "Min": sympy.Min,
    "floor": sympy.floor, "ceiling": sympy.ceiling, "Mod": sympy.Mod,
    "Eq": sympy.Equality, "Ne": sympy.Unequality, "Lt": sympy.StrictLessThan, "Le": sympy.LessThan,
    "Gt": sympy.StrictGreaterThan, "Ge": sympy.GreaterThan, "And": sympy.And, "Or": sympy.Or,
    "Not": sympy.Not,
}
#: functions of a fixed number of arguments (the others take two or more)
ARITY = {"Pow": 2, "Mod": 2, "Eq": 2, "Ne": 2, "Lt": 2, "Le": 2, "Gt": 2, "Ge": 2, "floor": 1, "ceiling": 1, "Not": 1}
_NAMES = {cls: name for name, cls in FUNCTIONS.items()}
#: what a guard, or an argument of And, Or and Not, is (a SymPy Symbol is a Boolean too: not here)
CONDITIONS = (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanFunction, sympy.logic.boolalg.BooleanAtom)
_BOOLS = {"true": sympy.true, "false": sympy.false}
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class Invalid(ValueError):
    """A document that is not a capture this codec writes (or one it cannot write)."""


# ---------------------------------------------------------------------------------- encoding


def encode(cap: Capture) -> dict:
    """``cap`` as a JSON-ready document; :class:`Invalid` if it holds a value outside the format."""
    enc = _Encoder()
    return {
        "records": [[r.op, [enc.tensor(t) for t in r.inputs], [enc.tensor(t) for t in r.outputs],
                     [enc.scalar(s) for s in r.scalars], r.module, r.layer] for r in cap.records],
        "groups": [[_plain(g.signature), list(g.indices)] for g in cap.groups],
        "params": {name: enc.tensor(t) for name, t in cap.params.items()},
        "linear_params": sorted(cap.linear_params),
        "symbols": {name: enc.expr(s) for name, s in cap.symbols.items()},
        "guards": [enc.expr(g) for g in cap.guards],
        "exprs": enc.exprs,
        "tensors": enc.tensors,
    }


class _Encoder:
    def __init__(self):
        self.exprs: list[list] = []
        self.tensors: list[list] = []
        self._expr_index: dict[sympy.Basic, int] = {}
        self._tensor_index: dict[TensorMeta, int] = {}

    def expr(self, e) -> int:
        if e in self._expr_index:
            return self._expr_index[e]
        if isinstance(e, sympy.Integer):
            node = ["Integer", int(e)]
        elif isinstance(e, sympy.Rational):
            node = ["Rational", int(e.p), int(e.q)]
        elif type(e) is sympy.Symbol:
            node = ["Symbol", e.name, dict(sorted(e.assumptions0.items()))]
        elif e is sympy.true or e is sympy.false:
            node = [str(e).lower()]
        elif type(e) in _NAMES:
            node = [_NAMES[type(e)], *(self.expr(a) for a in e.args)]
        else:
            raise Invalid(f"cannot store {type(e).__module__}.{type(e).__name__} ({str(e)[:60]})")
        self._expr_index[e] = len(self.exprs)
        self.exprs.append(node)
        return self._expr_index[e]

    def tensor(self, t: TensorMeta) -> int:
        if t not in self._tensor_index:
            self._tensor_index[t] = len(self.tensors)
            self.tensors.append([[self.expr(d) for d in t.shape], t.dtype, t.is_param, t.uid, list(t.broadcast)])
        return self._tensor_index[t]

    def scalar(self, s):
        if s is None or isinstance(s, (bool, int, str)):
            return s
        if isinstance(s, float):
            return s if math.isfinite(s) else {"float": repr(s)}
        if isinstance(s, sympy.Basic):
            return {"expr": self.expr(s)}
        raise Invalid(f"cannot store a scalar of type {type(s).__name__}")


def _plain(sig):
    """A layer signature (nested tuples of None, bools, ints and strings) as nested lists."""
    if isinstance(sig, tuple):
        return [_plain(x) for x in sig]
    if sig is None or isinstance(sig, (bool, int, str)):
        return sig
    raise Invalid(f"cannot store a layer signature holding {type(sig).__name__}")


# ---------------------------------------------------------------------------------- decoding


def decode(doc) -> Capture:
    """The capture a document describes; :class:`Invalid` for anything this codec did not write."""
    d = _fields(doc, "capture", ("records", "groups", "params", "linear_params", "symbols", "guards",
                                 "exprs", "tensors"))
    exprs = _Expressions(_list(d["exprs"], "exprs")).values
    tensors = [_tensor(t, exprs, f"tensors[{i}]") for i, t in enumerate(_list(d["tensors"], "tensors"))]
    groups = [_group(g, f"groups[{i}]") for i, g in enumerate(_list(d["groups"], "groups"))]
    representatives = {g.representative for g in groups}
    records = [_record(r, exprs, tensors, representatives, f"records[{i}]")
               for i, r in enumerate(_list(d["records"], "records"))]
    params = {_str(k, "params"): _ref(tensors, v, f"params[{k!r}]") for k, v in _dict(d["params"], "params").items()}
    symbols = {_str(k, "symbols"): _ref(exprs, v, f"symbols[{k!r}]") for k, v in _dict(d["symbols"], "symbols").items()}
    if not all(type(s) is sympy.Symbol for s in symbols.values()):
        raise Invalid("symbols: expected Symbol nodes")
    guards = tuple(_ref(exprs, g, "guards") for g in _list(d["guards"], "guards"))
    if not all(isinstance(g, CONDITIONS) for g in guards):
        raise Invalid("guards: expected conditions")
    linear = {_str(n, "linear_params") for n in _list(d["linear_params"], "linear_params")}
    return Capture(records, groups, params, linear, symbols, guards)


class _Expressions:
    """The node table decoded in order; each node's size is bounded before SymPy builds it."""

    def __init__(self, nodes: list):
        self.values: list[sympy.Basic] = []
        self._bits: list[int] = []
        self._tree: list[int] = []
        self._depth: list[int] = []
        for i, node in enumerate(nodes):
            where = f"exprs[{i}]"
            node = _list(node, where)
            if not node or type(node[0]) is not str:
                raise Invalid(f"{where}: expected [type, arguments...]")
            tag, args = node[0], node[1:]
            bits, tree, depth = self._size(tag, args, where)
            if bits > MAX_BITS or tree > MAX_TREE or depth > MAX_DEPTH:
                raise Invalid(f"{where}: too large an expression")
            self.values.append(self._value(tag, args, where))
            self._bits.append(bits)
            self._tree.append(tree)
            self._depth.append(depth)

    def _size(self, tag: str, args: list, where: str) -> tuple[int, int, int]:
        """(an upper bound on the bits of the node's value when every symbol is below
        2**SYMBOL_BITS, its nodes counted as a tree, its depth)."""
        if tag == "Integer" and len(args) == 1:
            return abs(_int(args[0], where)).bit_length(), 1, 1
        if tag == "Rational" and len(args) == 2:
            p, q = _int(args[0], where), _int(args[1], where)
            if q < 2 or math.gcd(p, q) != 1:
                raise Invalid(f"{where}: a Rational in lowest terms with a denominator above 1")
            return abs(p).bit_length() + q.bit_length(), 1, 1
        if tag == "Symbol" and len(args) == 2:
            return SYMBOL_BITS, 1, 1
        if tag in _BOOLS and not args:
            return 1, 1, 1
        if tag not in FUNCTIONS or not args:
            raise Invalid(f"{where}: unknown node {_short(tag)} with {len(args)} arguments")
        if len(args) != ARITY.get(tag, max(2, len(args))):
            raise Invalid(f"{where}: {tag} of {len(args)} arguments")
        if any(type(a) is not int or not 0 <= a < len(self.values) for a in args):
            raise Invalid(f"{where}: an argument that is not an earlier node")
        bits = [self._bits[a] for a in args]
        tree = 1 + sum(self._tree[a] for a in args)
        depth = 1 + max(self._depth[a] for a in args)
        if tag == "Add":
            return max(bits) + len(bits).bit_length(), tree, depth
        if tag == "Mul":
            return sum(bits), tree, depth
        if tag == "Pow":
            exponent = self.values[args[-1]]
            if not isinstance(exponent, sympy.Rational):
                raise Invalid(f"{where}: a power with an exponent that is not a number")
            return bits[0] * max(1, abs(int(exponent.p))), tree, depth
        return max(bits), tree, depth

    def _value(self, tag: str, args: list, where: str) -> sympy.Basic:
        if tag == "Integer":
            return sympy.Integer(args[0])
        if tag == "Rational":
            return sympy.Rational(*args)
        if tag == "Symbol":
            return _symbol(args[0], args[1], where)
        if tag in _BOOLS:
            return _BOOLS[tag]
        cls, children = FUNCTIONS[tag], tuple(self.values[a] for a in args)
        kind = CONDITIONS if tag in ("And", "Or", "Not") else sympy.Expr
        if not all(isinstance(c, kind) for c in children):
            raise Invalid(f"{where}: {tag} of {'a number' if kind is sympy.Expr else 'a condition'} expected")
        if tag == "Pow" and children[0].is_Number:
            raise Invalid(f"{where}: a power of a number")  # SymPy evaluates those (and 0**-1 is zoo)
        if tag == "Mod" and not (children[1].is_Integer and children[1] > 0):
            raise Invalid(f"{where}: a modulus that is not a positive integer")
        try:
            # unevaluated: SymPy's evaluation of a crafted node can take seconds (floor and Eq
            # ask the assumptions system); the bounds above keep evaluating it at a point cheap
            value = cls(*children, evaluate=False)
        # SymPy's constructors reject bad arguments with many kinds of errors (a condition in a
        # sum, a number where a condition belongs); each is a node this codec never writes.
        except Exception as e:  # noqa: BLE001
            raise Invalid(f"{where}: {tag} refuses its arguments ({type(e).__name__})") from None
        if value.func is not cls or value.args != children:
            raise Invalid(f"{where}: {tag} of these arguments is not as SymPy writes it")
        return value


def _symbol(name, assumptions, where: str) -> sympy.Symbol:
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_CHARS:
        raise Invalid(f"{where}: expected a symbol name")
    facts = _dict(assumptions, where)
    if not set(facts) <= ASSUMPTIONS or not all(type(v) is bool for v in facts.values()):
        raise Invalid(f"{where}: expected SymPy assumptions (name: true/false)")
    try:
        return sympy.Symbol(name, **facts)
    except Exception as e:  # noqa: BLE001 — contradictory assumptions, in SymPy's own error type
        raise Invalid(f"{where}: contradictory assumptions ({type(e).__name__})") from None


def _tensor(t, exprs: list, where: str) -> TensorMeta:
    shape, dtype, is_param, uid, broadcast = _fixed(t, 5, where)
    shape = tuple(_ref(exprs, d, where) for d in _list(shape, where))
    broadcast = tuple(_bool(b, where) for b in _list(broadcast, where))
    if broadcast and len(broadcast) != len(shape):
        raise Invalid(f"{where}: one broadcast flag per dim")
    if not all(isinstance(d, sympy.Expr) for d in shape):
        raise Invalid(f"{where}: a dim that is a condition")
    return TensorMeta(shape, _str(dtype, where), _bool(is_param, where), _int(uid, where), broadcast)


def _group(g, where: str) -> LayerGroup:
    signature, indices = _fixed(g, 2, where)
    indices = tuple(_int(i, where, minimum=0) for i in _list(indices, where))
    if not indices or len(set(indices)) != len(indices):
        raise Invalid(f"{where}: expected distinct layer indices")
    return LayerGroup(_signature(signature, where, 0), indices)


def _signature(sig, where: str, depth: int):
    if depth > 8:
        raise Invalid(f"{where}: a signature nested too deep")
    if type(sig) is list:
        return tuple(_signature(x, where, depth + 1) for x in sig)
    if sig is None or type(sig) in (bool, int, str):
        return sig
    raise Invalid(f"{where}: a signature holding {type(sig).__name__}")


def _record(r, exprs: list, tensors: list, representatives: set, where: str) -> OpRecord:
    op, ins, outs, scalars, module, layer = _fixed(r, 6, where)
    if layer is not None and _int(layer, where) not in representatives:
        raise Invalid(f"{where}: layer {_short(layer)} is no group's representative")
    return OpRecord(_str(op, where), tuple(_ref(tensors, t, where) for t in _list(ins, where)),
                    tuple(_ref(tensors, t, where) for t in _list(outs, where)),
                    tuple(_scalar(s, exprs, where) for s in _list(scalars, where)), _str(module, where), layer)


def _scalar(s, exprs: list, where: str):
    if s is None or type(s) in (bool, int, str):
        return s
    if type(s) is float and math.isfinite(s):
        return s
    if type(s) is dict and len(s) == 1:
        if "expr" in s:
            return _ref(exprs, s["expr"], where)
        if s.get("float") in _NONFINITE:
            return _NONFINITE[s["float"]]
    raise Invalid(f"{where}: a scalar {_short(s)}")


# ------------------------------------------------------------------------------ field checks


def _fields(doc, where: str, names: tuple) -> dict:
    doc = _dict(doc, where)
    if set(doc) != set(names):
        raise Invalid(f"{where}: expected the fields {', '.join(names)}")
    return doc


def _fixed(x, n: int, where: str) -> list:
    if type(x) is not list or len(x) != n:
        raise Invalid(f"{where}: expected a list of {n}")
    return x


def _list(x, where: str) -> list:
    if type(x) is not list:
        raise Invalid(f"{where}: expected a list")
    return x


def _dict(x, where: str) -> dict:
    if type(x) is not dict:
        raise Invalid(f"{where}: expected an object")
    return x


def _str(x, where: str) -> str:
    if type(x) is not str:
        raise Invalid(f"{where}: expected a string, got {_short(x)}")
    return x


def _bool(x, where: str) -> bool:
    if type(x) is not bool:
        raise Invalid(f"{where}: expected true or false, got {_short(x)}")
    return x


def _int(x, where: str, minimum: int | None = None) -> int:
    if type(x) is not int or (minimum is not None and x < minimum):
        raise Invalid(f"{where}: expected an integer{'' if minimum is None else f' ≥ {minimum}'}, got {_short(x)}")
    return x


def _ref(table: list, i, where: str):
    if type(i) is not int or not 0 <= i < len(table):
        raise Invalid(f"{where}: {_short(i)} is not an index of its table")
    return table[i]


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:40] + "…"
