"""How many of a device's experts a batch of routed tokens reaches: the weights an MoE step reads.

A grouped-GEMM MoE kernel (vLLM's Triton ``fused_moe``, TensorRT-LLM's CUTLASS and trtllm-gen
runners, SGLang's) launches work only for the experts that received tokens (``fused_moe``:
``moe_align_block_size`` builds blocks per expert, none for an empty one), so a memory-bound
step reads the weights of those experts and no others. How many that is depends on how tokens
route; a leaf names its assumption (``routing``):

- ``random`` (the default): each of the group's ``T`` tokens picks its ``k`` experts as a uniform
  random ``k``-subset of the ``E``, independently of the other tokens — the router a
  load-balancing loss or bias trains for (every expert's expected share ``k/E``; Switch
  Transformer, Fedus et al. 2022, §2.2; DeepSeek-V3, arXiv 2412.19437, §2.1.2), with no
  correlation assumed between tokens. An expert is missed by one token with probability
  ``1 − k/E``, by all ``T`` with ``(1 − k/E)^T``, so a device holding ``E/ep`` of them reads
  ``(E/ep)·(1 − (1 − k/E)^T)`` in expectation (the occupancy problem: Feller, *An Introduction
  to Probability Theory and Its Applications*, vol. 1, §II.11 and §IV.2).
- ``balanced``: the tokens spread as widely as they can, ``min(E/ep, T·k/ep)`` experts — the
  spread of aiconfigurator's ``balanced_logits`` (token ``i`` to experts ``i + j·⌈E/k⌉ mod E``),
  which its ``balanced`` MoE tables measure and perfcast's MoE fits are calibrated on (the two
  agree with ``random`` for ``T·k ≪ E`` and ``T·k ≫ E``; between them ``balanced`` reads up to
  1/(1 − 1/e) ≈ 1.58 times as many experts).

Skewed routing (a hot expert, aiconfigurator's ``power_law_*`` tables) reaches fewer experts
still; no skew is assumed without a measurement of the served traffic's routing.
"""

from __future__ import annotations

import math

import numpy as np
import sympy

from perfcast.ir.errors import UserError

ROUTINGS = ("random", "balanced")
DEFAULT = "random"
#: the measured tables' skewed distributions (aiconfigurator's power_law_<alpha>): a table keyed on
#: routing prices a leaf named so; the work model bounds it by balanced routing's experts
MEASURED = "power_law_"
_SCALE = 2 ** 32


def _reached(local: float, tokens: float, share: float) -> float:
    return local * -math.expm1(tokens * math.log1p(-share))


class experts_reached(sympy.Function):  # noqa: N801 — printed by name in closed forms
    """``local·(1 − (1 − share)^tokens)``, random routing's expected experts reached. With
    numbers for arguments it is that value as an exact rational to 2⁻³² (``(1 − k/E)^T`` as a
    rational has ``T`` times the digits of ``k/E``, past what Python prints at a few thousand
    tokens; the IR holds no floats); with a symbol it stays a function, so a closed form
    substituted later lands on the same rational as a concrete lowering. NumPy prints it as
    ufuncs (``expm1``, ``log1p``), which a step model's checked source allows."""

    nargs = 3

    @classmethod
    def eval(cls, local, tokens, share):
        if local.is_number and tokens.is_number and share.is_number:
            if share >= 1:
                return local
            return sympy.Rational(round(_reached(float(local), float(tokens), float(share)) * _SCALE), _SCALE)
        return None

    def fdiff(self, argindex=1):
        local, tokens, share = self.args
        missed = (1 - share) ** tokens
        if argindex == 1:
            return 1 - missed
        if argindex == 2:
            return -local * missed * sympy.log(1 - share)
        return local * tokens * (1 - share) ** (tokens - 1)

    def _numpycode(self, printer):
        local, tokens, share = (printer._print(a) for a in self.args)
        return (f"({local})*(-{printer._module_format('numpy.expm1')}(({tokens})*"
                f"{printer._module_format('numpy.log1p')}(-({share}))))")

    def _pythoncode(self, printer):
        local, tokens, share = (printer._print(a) for a in self.args)
        return f"({local})*(-math.expm1(({tokens})*math.log1p(-({share}))))"


def check(routing: str, experts: int, model: str) -> None:
    """``--moe-routing`` names a routing, and applies only to a model with routed experts."""
    if routing not in ROUTINGS:
        raise UserError(f"--moe-routing {routing!r}: expected one of {', '.join(ROUTINGS)}")
    if routing != DEFAULT and not experts:
        raise UserError(f"--moe-routing {routing}: {model} has no routed experts")


def active_experts(local, tokens, top_k, experts, routing: str | None):
    """Expected experts of the ``local`` (``E/ep``) on one device that ``tokens`` (the whole MoE
    group's, each routed to ``top_k`` of ``experts``) reach: SymPy when a size is SymPy,
    NumPy (elementwise over arrays of shapes) otherwise."""
    routing = routing or "balanced"
    if routing.startswith(MEASURED):  # a measured table's skew: its rows price it, the bound here
        routing = "balanced"
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r}: expected one of {', '.join(ROUTINGS)} or {MEASURED}*")
    if any(isinstance(x, sympy.Basic) for x in (local, tokens, top_k, experts)):
        local, tokens = sympy.sympify(local), sympy.sympify(tokens)
        share = sympy.sympify(top_k) / sympy.sympify(experts)
        if routing == "balanced":
            return sympy.Min(local, tokens * share * local)
        return experts_reached(local, tokens, share)
    local, tokens, share = (np.asarray(x, dtype=float) for x in (local, tokens, np.divide(top_k, experts)))
    if routing == "balanced":
        return np.minimum(local, tokens * share * local)
    with np.errstate(divide="ignore"):  # k = E: log(0) = −inf, every expert reached
        return local * -np.expm1(tokens * np.log1p(-share))
