"""The lowering of the mixer ops the serving substitutions emit (:mod:`perfcast.capture.ops`):
their leaf kinds (rules in :mod:`perfcast.ir.rules_mixers`) and the attributes read off their
scalar arguments. No torch: cached captures are lowered without it."""

from __future__ import annotations

#: op packet -> leaf kind
KINDS = {"sparse_attention": "sparse_attention", "sparse_indexer": "sparse_indexer",
         "gated_delta_rule": "gated_delta_rule", "causal_conv1d": "causal_conv1d"}
#: kinds whose K/V inputs are the KV cache (stored in the --kv-dtype when one is given)
CACHED = {"sparse_attention": (1, 2), "sparse_indexer": (1,)}


def _sparse_attention(rec, attrs, lw) -> None:
    past, shared, width, topk = rec.scalars[:4]
    attrs.update(past=lw.expr(past), shared_kv=bool(shared), cache_width=int(width), topk=int(topk))


def _sparse_indexer(rec, attrs, lw) -> None:
    past, topk = rec.scalars[:2]
    attrs.update(past=lw.expr(past), topk=int(topk))


def _gated_delta_rule(rec, attrs, lw) -> None:
    past, decode, state = rec.scalars[:3]
    attrs.update(past=lw.expr(past), decode=bool(decode), state_dtype=str(state))


def _causal_conv1d(rec, attrs, lw) -> None:
    past, decode = rec.scalars[:2]
    attrs.update(past=lw.expr(past), decode=bool(decode))


ATTRS = {"sparse_attention": _sparse_attention, "sparse_indexer": _sparse_indexer,
         "gated_delta_rule": _gated_delta_rule, "causal_conv1d": _causal_conv1d}
