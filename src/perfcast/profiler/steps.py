"""Real serving steps of a Hugging Face causal LM with random weights, on a torch device.

Why: perfcast's prediction of a step is only as good as its agreement with the same step run for
real. This module builds the model a catalog config describes — real tensors, random values —
and the two steps a serving engine runs, in the form perfcast prices them:

- **prefill**: ``batch`` sequences of ``tokens`` new tokens, no cache before them, logits for
  the last position only (``logits_to_keep=1``, as perfcast's capture computes them);
- **decode**: one new token per sequence after ``context`` cached ones. The cache is a
  transformers ``StaticCache`` of ``context + 1`` slots (default) or a ``DynamicCache`` (what
  ``generate()`` uses by default). Either is allocated by the model itself on a first forward
  (so every architecture gets its own key/value shapes), then filled with random keys and values
  and set to hold ``context`` tokens; before every timed step :meth:`DecodeStep.reset` puts it
  back there, so repeated steps (and CUDA-graph replays) all run the same step.

Weights come from transformers' own initialisation (normal, std ``initializer_range``), run on
the target device under ``torch.device``: on a GPU the random fill of an 8B model is a few
passes over 16 GB at HBM speed, tens of milliseconds; skipping it (meta device and
``to_empty``) would leave uninitialised memory — possibly zeros, on which matrix units run
faster than on real data — and buffers such as the rotary ``inv_freq`` unset.

:class:`HostReads` lists the ops in a step that read device values on the host (``.item()``,
``nonzero``) or copy host data to the device (``torch.tensor``): a CUDA-graph capture can contain
neither.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perfcast.ir import UserError
from perfcast.models import ModelConfig

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CACHES = ("static", "dynamic")


@dataclass
class Built:
    model: torch.nn.Module
    parameters: int
    weight_bytes: int
    build_s: float
    attention: str  # the transformers attention implementation the model runs
    experts: str | None  # the experts implementation (MoE models), else None
    weight_std: float  # of the first linear weight: a check that the weights are random


def build(model: ModelConfig, dtype: str, device, seed: int = 0) -> Built:
    """The causal LM of ``model``'s config with random weights on ``device``, in eval mode."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from perfcast.capture.build import hf_config

    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    config = hf_config(model)
    if hasattr(config, "quantization_config"):  # a checkpoint's quantizer needs its weights
        delattr(config, "quantization_config")
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    cls = getattr(module, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])
    device = torch.device(device)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.device(device):
        net = cls._from_config(config, dtype=DTYPES[dtype], attn_implementation="sdpa")
    net.eval().requires_grad_(False)
    first = next(net.parameters())
    if first.device.type != device.type:
        raise RuntimeError(f"transformers built the model on {first.device}, not {device}")
    _sync(device)
    built_s = time.perf_counter() - t0
    linear = next(m.weight for m in net.modules() if isinstance(m, torch.nn.Linear))
    params = sum(p.numel() for p in net.parameters())
    return Built(net, params, sum(p.numel() * p.element_size() for p in net.parameters()), built_s,
                 str(net.config._attn_implementation), getattr(net.config, "_experts_implementation", None)
                 if _is_moe(net.config) else None, float(linear.float().std()))


def _is_moe(config) -> bool:
    return any(getattr(config, k, None) for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cache_kwarg(net) -> str:
    """The forward's cache argument: ``cache`` (transformers ≥ 5.2x) or ``past_key_values``."""
    params = inspect.signature(net.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class PrefillStep:
    """``batch`` × ``tokens`` new tokens into an empty cache, logits for the last position only.

    The step writes its keys and values into a ``DynamicCache``, as a serving prefill fills the
    cache. (Without a cache, transformers checks the positions for packed sequences —
    ``masking_utils.find_packed_sequence_indices`` — which reads a device value on the host.)
    The cache's layers are set up once, by a one-token forward, and :meth:`reset` empties them
    to zero-length views of that forward's tensors: a step then allocates nothing on the host
    side that a CUDA-graph capture could not record."""

    def __init__(self, net, batch: int, tokens: int, seed: int = 0):
        from transformers import DynamicCache

        dev = next(net.parameters()).device
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.net, self.arg = net, _cache_kwarg(net)
        self.ids = torch.randint(0, net.config.vocab_size, (batch, tokens), generator=gen).to(dev)
        self.cache = DynamicCache(config=net.config)
        with torch.no_grad():
            net(input_ids=self.ids[:, :1], use_cache=True, **{self.arg: self.cache})
        self.empty = [(layer.keys[..., :0, :], layer.values[..., :0, :]) for layer in self.cache.layers]
        self.reset()
        self.description = (f"prefill: {batch} x {tokens} new tokens into an empty transformers DynamicCache, "
                            f"logits for the last position")

    def reset(self) -> None:
        """An empty cache again (each step starts from no cached tokens)."""
        for layer, (k, v) in zip(self.cache.layers, self.empty):
            layer.keys, layer.values = k, v

    def cached_tokens(self) -> int:
        return int(self.cache.get_seq_length())

    def __call__(self):
        with torch.no_grad():
            return self.net(input_ids=self.ids, use_cache=True, logits_to_keep=1, **{self.arg: self.cache}).logits


class DecodeStep:
    """One new token for each of ``batch`` sequences after ``context`` cached tokens."""

    def __init__(self, net, batch: int, context: int, cache: str = "static", seed: int = 0):
        from transformers import DynamicCache, StaticCache

        if cache not in CACHES:
            raise UserError(f"--decode-cache {cache!r}: expected one of {', '.join(CACHES)}")
        if context < 1:
            raise UserError(f"decode needs a context of at least 1 token (got {context})")
        dev = next(net.parameters()).device
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.net, self.context, self.kind = net, context, cache
        self.ids = torch.randint(0, net.config.vocab_size, (batch, 1), generator=gen).to(dev)
        self.positions = torch.full((batch, 1), context, dtype=torch.long, device=dev)
        self.arg = _cache_kwarg(net)
        if cache == "static":
            self.cache = StaticCache(config=net.config, max_cache_len=context + 1)
        else:
            self.cache = DynamicCache(config=net.config)
        with torch.no_grad():  # the model allocates the cache at its own key/value shapes
            net(input_ids=self.ids, position_ids=torch.zeros_like(self.positions), use_cache=True,
                **{self.arg: self.cache})
        # Random keys and values, drawn on the device (a 64 x 4096-token cache is tens of GB).
        fill = torch.Generator(device=dev).manual_seed(seed + 1)
        for layer in self.cache.layers:
            if cache == "static":
                for t in (layer.keys, layer.values):
                    t.normal_(generator=fill)
            else:
                layer.keys, layer.values = (
                    torch.randn((*t.shape[:2], context, t.shape[3]), generator=fill, dtype=t.dtype, device=dev)
                    for t in (layer.keys, layer.values))
        # DynamicCache.update replaces each layer's tensors by torch.cat([cached, new]) and leaves
        # its inputs alone: the filled tensors are the state every step starts from (contiguous,
        # as generate()'s cache is — a slice of the step's output would not be, and a cat reading
        # a strided input ran 5.8x slower on an H200: docs/design/validation.md, "GPU closed loop")
        self.filled = [(layer.keys, layer.values) for layer in self.cache.layers] if cache == "dynamic" else []
        self.reset()
        self.description = (f"decode: {batch} sequences x 1 new token after {context} cached, "
                            f"transformers {type(self.cache).__name__}")

    def reset(self) -> None:
        """Back to ``context`` cached tokens: the next step writes slot ``context``."""
        for layer in self.cache.layers:
            if self.kind == "static":
                layer.cumulative_length.fill_(self.context)
                if hasattr(layer, "cumulative_length_int"):
                    layer.cumulative_length_int = self.context
            else:
                if isinstance(getattr(layer, "cumulative_length", None), int):
                    layer.cumulative_length = self.context
        for layer, (k, v) in zip(self.cache.layers, self.filled):
            # DynamicCache.update concatenates: back to the filled tensors, without the slot the
            # last step appended
            layer.keys, layer.values = k, v

    def cached_tokens(self) -> int:
        return int(self.cache.get_seq_length())

    def __call__(self):
        with torch.no_grad():
            return self.net(input_ids=self.ids, position_ids=self.positions, use_cache=True,
                            logits_to_keep=1, **{self.arg: self.cache}).logits


#: Ops that make the host wait for device values (their result or its size depends on them),
#: and ``lift_fresh`` — ``torch.tensor(data)``, a copy of host data to the device. A CUDA-graph
#: capture can hold neither (CUDA refuses synchronisation and pageable copies while capturing).
HOST_READ_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                           "unique_consecutive", "bincount", "lift_fresh"})


class HostReads(TorchDispatchMode):
    """Counts the ops run inside it that exchange data with the host (see :data:`HOST_READ_OPS`;
    ``repeat_interleave`` with tensor repeats too). It sees the ops the model's Python code calls;
    a synchronisation inside an op's own implementation shows only when a capture is tried."""

    def __init__(self):
        super().__init__()
        self.found: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READ_OPS or (name == "repeat_interleave" and "Tensor" in func._overloadname):
            self.found[f"aten.{name}"] += 1
        return func(*args, **(kwargs or {}))


def host_reads(step) -> Counter:
    """The host reads of one run of ``step`` (its state is reset before and after)."""
    step.reset()
    with HostReads() as mode:
        step()
    step.reset()
    return mode.found
