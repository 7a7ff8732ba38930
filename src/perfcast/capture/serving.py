"""Serving semantics substituted into Hugging Face modules during capture: the step's session
(KV-cache context, phase) and the two transformers interfaces perfcast registers.

- Attention: registered as a transformers attention implementation ("perfcast"); it calls
  ``perfcast.attention`` with the session's KV-cache context, causality, the module's sliding
  window, chunked local attention (a layer of type ``chunked_attention``: Llama 4) and logit
  soft-capping (Gemma 2).
- Routed experts: registered as a transformers experts implementation ("perfcast"); it calls
  ``perfcast.moe_experts`` (one grouped GEMM; tokens per expert from the routing assumption).

Modules that go through neither interface (MLA, DeepSeek sparse attention, Gated DeltaNet,
Falcon's attention, Llama 4's experts) get serving forms of their own:
:mod:`perfcast.capture.substitutions`.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

from perfcast.capture import ops  # noqa: F401  (registers the perfcast.* custom ops)

IMPL = "perfcast"


@dataclass(frozen=True)
class Session:
    """What the substituted modules need to know about the step being captured."""

    past: int | torch.SymInt  # tokens already in the KV cache of each sequence
    decode: bool


_SESSION: contextvars.ContextVar[Session] = contextvars.ContextVar("perfcast_capture_session")


def session() -> Session:
    return _SESSION.get()


@contextlib.contextmanager
def serving(s: Session):
    token = _SESSION.set(s)
    try:
        yield
    finally:
        _SESSION.reset(token)


def layer_type(module) -> str | None:
    """The attention module's layer type (``sliding_attention``, ``chunked_attention``, …): its own
    attribute, else its config's ``layer_types`` at its index."""
    own = getattr(module, "layer_type", None) or getattr(module, "attention_type", None)
    if own is not None:
        return own
    types, idx = getattr(getattr(module, "config", None), "layer_types", None), getattr(module, "layer_idx", None)
    return types[idx] if types and idx is not None and idx < len(types) else None


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=None, softcap=None, **kwargs):
    s = session()
    window = int(sliding_window or getattr(module, "sliding_window", None) or 0)
    past, chunk = s.past, 0
    if layer_type(module) == "chunked_attention":
        # Llama 4's local layers attend within blocks of attention_chunk_size tokens
        # (modeling_llama4.py: create_chunked_causal_mask): only the current block's cached
        # tokens are read, and serving engines keep only those (vLLM ChunkedLocalAttention)
        chunk = int(module.config.attention_chunk_size)
        past = past % chunk
    out = torch.ops.perfcast.attention(query, key, value, past, True, window, False, 0, chunk,
                                       float(softcap or 0.0))
    return out, None


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = torch.ops.perfcast.moe_experts(hidden_states, self.gate_up_proj, self.down_proj,
                                         top_k_index, int(top_k_index.shape[-1]),
                                         int(self.num_experts))
    return out


def register() -> None:
    """Register the "perfcast" attention and experts implementations (idempotent). No mask
    function is registered: the substituted attention derives causality, windows and chunks
    itself, and transformers' mask builders return no mask for an implementation without one
    (masking_utils._preprocess_mask_arguments), so no O(S²) mask tensor is built or charged."""
    from transformers import AttentionInterface
    from transformers.integrations.moe import ExpertsInterface

    AttentionInterface.register(IMPL, attention_forward)
    ExpertsInterface.register(IMPL, experts_forward)
