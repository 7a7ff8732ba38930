"""The step model: one engine step priced for any batch mix, compiled once per deployment.

A deployment's step is captured twice with symbolic sizes (:mod:`perfcast.capture.cache`): the
decode step in ``B`` sequences and ``C`` cached tokens, and the prefill in ``B`` sequences of
``S`` new tokens after ``C`` cached ones. Both are laid out on the deployment's layout, rewritten
as its engine runs them (:func:`perfcast.engines.apply`), lowered and rolled up once per size
decision of the engine (launch mode, all-reduce strategy: :func:`perfcast.engines.size_decisions`).
The rolled-up leaves fall in three classes by the symbols their time depends on:

- **dense** (``B`` or ``B·S`` only): the GEMMs, norms, activations, collectives — at the step's tokens;
- **attention** (``C`` too): each request's attention over its own context;
- **per sequence** (prefill leaves in ``B`` only): the LM head over the last position of each
  sequence (TensorRT-LLM and vLLM compute logits for the last token of a prompt).

A continuous-batching engine runs one forward over the packed tokens of every scheduled request
(TensorRT-LLM ``PyExecutor._forward_step``; vLLM v1 ``GPUModelRunner.execute_model``), so a step of
a mix is the dense part at the total tokens, plus every request's attention at its own sizes, plus
the LM head at the sequences:

    t(mix) = dense(T) + head(n) + attn_decode(B_d, C̄_d) + Σ_chunks attn_prefill(1, s_i, p_i)

with ``T`` the tokens, ``n`` the sequences, ``C̄_d`` the decodes' mean context (exact where the
decode attention is linear in the context). A step of decodes alone is the decode capture itself
(launched as the engine launches decodes), plus the GPU idle the engine's loop leaves between two
decode steps where its profile states a measured figure (``launch.iteration_gap_s``); a step
holding a prefill chunk runs as the engine runs prefills. Speculative verification of ``1 + k``
tokens per sequence is the decode step's dense part at ``B·(1 + k)`` tokens and the prefill
attention of ``1 + k`` queries per sequence.

Evaluation never re-captures: the dense parts are tabulated over every token count once (one
vectorised call), the attention parts lazily per batch (decode) or chunk length (prefill) on a
16-token context grid, linearly interpolated between grid points (:data:`GRID`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from functools import cached_property
from types import MappingProxyType

import numpy as np
import sympy

from perfcast import engines
from perfcast.capture import cache, lower
from perfcast.capture import parallel as par
from perfcast.hardware import get_device
from perfcast.hardware.device import scaled
from perfcast.inference import quantization
from perfcast.inference.roofline import DatasheetRoofline
from perfcast.inference.steps import decisions
from perfcast.inference.textgen import Request, make_model
from perfcast.ir import UserError, dim, routing
from perfcast.rollup import LaunchModel, rollup
from perfcast.serving import step_cache
from perfcast.serving.step_grid import GRID, decode_attention, on_grid, prefill_on_grid
from perfcast.serving.step_rows import Rows
from perfcast.serving.types import Mix

STEP_MODELS = ("analytic", "roofline")   # the performance models a step model compiles for: closed forms


@dataclass(frozen=True)
class Deployment:
    """One engine instance: the model, the device, the engine and the layout it runs. Plain and
    hashable: a search builds thousands and compiles each distinct one once."""

    model: str
    device: str
    engine: str | None = None
    layout: par.Layout = par.Layout()
    dtype: str = "bf16"
    quantize: str | None = None
    kv_dtype: str | None = None
    topology: str | None = None
    performance_model: str = "analytic"
    what_if: tuple[tuple[str, float], ...] = ()   # hardware multipliers (perfcast.hardware.device.scaled)
    engine_options: tuple[tuple[str, str], ...] = ()  # --engine-option NAME=VALUE, sorted
    cuda_graph_max: int | None = None   # --cuda-graph-max-batch-size (None: the engine's)
    moe_routing: str = routing.DEFAULT   # --moe-routing (perfcast.ir.routing)

    def request(self, *, decode: bool, batch: int, length: int, context: int = 0) -> Request:
        """The text-generate request of one step of this deployment (``batch`` sequences per
        data-parallel rank)."""
        from perfcast.inference.silicon import catalog_model

        what = dict(self.what_if)
        device = scaled(get_device(self.device), what) if what else get_device(self.device)
        return Request(model=catalog_model(self.model), device=device, link_scale=what.get("link_bandwidth", 1.0),
                       num_queries=batch * self.layout.dp, query_length=1 if decode else length,
                       context_length=length if decode else context, decode=decode, dtype=self.dtype,
                       quantize=self.quantize, kv_dtype=self.kv_dtype, layout=self.layout,
                       engine=self.engine, engine_options=self.engine_options, topology=self.topology,
                       cuda_graph_max=self.cuda_graph_max, moe_routing=self.moe_routing)

    @property
    def devices(self) -> int:
        return self.layout.num_devices


@dataclass
class _Part:
    """One lowering's rolled-up parts as NumPy functions (the symbolic shapes hold at size one: tested)."""

    dense: object   # (B) or (B, S) -> s
    attention: object  # (B, C) or (B, S, C) -> s
    head: object | None  # prefill: (B) -> s
    host: float = 0.0  # the host's issue time of the step's launches (eager; else 0): the step is at least this


class StepModel:
    """Prices :class:`~perfcast.serving.types.Mix` steps of one data-parallel rank's engine instance,
    tabulated up front to ``max_tokens``."""

    def __init__(self, deployment: Deployment, *, max_tokens: int = 16384, stage: int | None = None):
        if deployment.performance_model not in STEP_MODELS:
            raise UserError(f"--performance-model {deployment.performance_model!r}: serving prices steps from "
                            f"closed forms; expected one of {', '.join(STEP_MODELS)}")
        if (deployment.layout.pp > 1) != (stage is not None):
            raise ValueError("a pipeline-parallel deployment's step model is one stage's "
                             "(perfcast.serving.step_pipeline.PipelineStepModel composes them)")
        self.deployment, self.stage = deployment, stage
        self.proto = deployment.request(decode=True, batch=2, length=2)
        self.proto.validate()
        self.profile = self.proto.profile()
        self.max_tokens = int(max_tokens)
        pm = self._pricing()
        key = step_cache.key_of("step" if stage is None else f"step.stage{stage}", deployment, self.proto,
                                self.max_tokens)
        (self._decode, self._prefill, self._dense_decode, self._dense_prefill, self._head,
         self.unpriced) = step_cache.remembered(key, lambda: self._compiled(pm), lambda c: step_cache.encode(c, pm),
                                                lambda doc: step_cache.decode(doc, pm, self.max_tokens, _Part))
        self._host_decode, self._host_prefill = self._host_table(self._decode), self._host_table(self._prefill)
        #: the engine loop's GPU idle between decode steps, added to each (None: no figure, or a pipeline stage)
        gap = self.iteration_gap = None if stage is not None else engines.iteration_gap(self.profile, self.proto.device)
        self._gap_s = g = gap.value_s if gap else 0.0
        self._dense_decode = [0.0] + [x + g for x in self._dense_decode[1:]]
        self._host_decode = [0.0] + [x + g if x else 0.0 for x in self._host_decode[1:]]
        self.rows = Rows(key)   # the attention rows: decode (0, batch, part), prefill (1, batch, new, part)
        self.distinct = [self]  # the step models pricing its steps (a pipeline's: its distinct stages)
        self.source = (f"{self.profile.name} step of {deployment.model} on {deployment.device} "
                       f"({deployment.layout.describe()}), {deployment.performance_model} pricing"
                       + ("" if stage is None else f", pipeline stage {stage}"))

    # Compilation --------------------------------------------------------------------------
    def _pricing(self):
        """The performance model the step is rolled up with."""
        proto, name = self.proto, self.deployment.performance_model
        return DatasheetRoofline(proto.device, proto.mesh()) if name == "roofline" else \
            make_model(name, proto.device, None, proto.mesh(), self.profile)

    def _compiled(self, pm) -> tuple:
        """(decode parts, prefill parts, dense decode table, dense prefill table, head table,
        unpriced ops): what the step cache keeps."""
        unpriced = Counter()
        decode, prefill = self._compile(True, pm, unpriced), self._compile(False, pm, unpriced)
        return (decode, prefill, self._table(decode, decode=True), self._table(prefill, decode=False),
                self._head_table(prefill), unpriced)

    def _compile(self, decode: bool, pm, unpriced: Counter) -> dict[tuple, tuple[_Part, list[int]]]:
        """Per size decision of the engine: the lowering's parts and the token counts it serves."""
        dep, proto = self.deployment, self.proto
        model, layout = proto.model, dep.layout
        rank = replace(model, data=par.rank_config(model.data, layout)) if not layout.trivial else model
        cap, _ = cache.symbolic_capture(rank, dtype=dep.dtype, decode=decode, context=True, reroll=True)
        cap = par.parallelize(cap, layout, model.data, self.profile.exchange(proto.device.name))
        applied = engines.apply(self.profile, cap, decode=decode, device=proto.device.name,
                                hidden_size=int(model.data["hidden_size"]))
        if self.stage is not None:   # this stage's layers, as text-generate splits them (par.stages)
            staged = par.stages(applied.capture, layout.pp, int(model.data["num_hidden_layers"]))[self.stage][0]
            applied = replace(applied, capture=staged)
        quant = quantization.resolve(proto)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for t in range(1, self.max_tokens + 1):
            groups[decisions(self.profile, proto, t, decode)].append(t)
        out = {}
        for key, tokens in groups.items():
            rep = tokens[len(tokens) // 2]
            at = {dim("B"): rep, dim("C"): 2} if decode else {dim("B"): 1, dim("S"): rep, dim("C"): 2}
            low = lower(applied.capture, quantize=quant.plan, model_dtype=dep.dtype, kv_dtype=quant.kv_override,
                        name=model.name, plan=applied.plan, engine=self.profile.name, decide_at=at,
                        moe_routing=dep.moe_routing)
            unpriced.update(low.unknown)
            launch = engines.launch_for(self.profile, decode=decode, tokens=rep, device=proto.device)
            out[key] = (self._parts(rollup(low.graph, pm, LaunchModel(launch.mode, launch.host_interval_s)),
                                    pm, decode), tokens)
        return out

    def _host_table(self, parts: dict) -> list[float]:
        """The host's issue time of the launches at 1..max_tokens tokens (0: a CUDA graph replays them)."""
        out = np.zeros(self.max_tokens + 1)
        for part, tokens in parts.values():
            out[_at(tokens)] = part.host
        return out.tolist()

    @staticmethod
    def _parts(r, pm, decode: bool) -> _Part:
        by = {s.name: s for s in r.free_symbols}
        B, S, C = (by.get(n, sympy.Symbol(n)) for n in "BSC")
        dense, attention, head = [], [], []
        for leaf in r.leaves:
            t = leaf.time_s + leaf.trips * leaf.launch_s
            names = {s.name for s in t.free_symbols}
            if "C" in names:
                attention.append(t)
            elif not decode and "S" not in names:
                head.append(t)
            else:
                dense.append(t)
        mods = [pm.numpy_functions(), "numpy"]
        args = (B,) if decode else (B, S)
        host = sympy.sympify(r.host_issue_s)
        if host.free_symbols:
            raise ValueError(f"the host's issue time of a step depends on {sorted(map(str, host.free_symbols))}")
        return _Part(dense=sympy.lambdify(args, sympy.Add(*dense), modules=mods),
                     attention=sympy.lambdify((*args, C), sympy.Add(*attention), modules=mods),
                     head=None if decode else sympy.lambdify((B,), sympy.Add(*head), modules=mods),
                     host=float(pm.realize(host)))

    def _table(self, parts: dict, decode: bool) -> list[float]:
        """The dense part at every token count 1..max_tokens (index = tokens)."""
        out = np.zeros(self.max_tokens + 1)
        for part, tokens in parts.values():
            t = np.asarray(tokens, dtype=float)
            out[tokens] = np.broadcast_to(part.dense(t) if decode else part.dense(np.ones_like(t), t), t.shape)
        return out.tolist()

    def _head_table(self, prefill: dict) -> list[float]:
        """The LM head over ``n`` sequences' last positions (prefill graph), n = 0..max_tokens."""
        out = np.zeros(self.max_tokens + 1)
        for part, tokens in prefill.values():
            t = np.asarray(tokens, dtype=float)
            out[tokens] = np.broadcast_to(part.head(t), t.shape)
        return out.tolist()

    @cached_property
    def _part_ix(self) -> dict[bool, list[int]]:
        """The index of a step of ``t`` tokens' part in ``_arrays``' list: ``_part_ix[decode][t]``."""
        _, _, _, _, decode_ix, prefill_ix, _, _ = self._arrays
        return {True: decode_ix.tolist(), False: prefill_ix.tolist()}

    # Attention rows (perfcast.serving.step_rows: linear on the 16-token grid, grown lazily) --------
    def attention_decode_s(self, batch: int, context: float, tokens: int) -> float:
        ix = self._part_ix[True][tokens]
        part = self._arrays[3][ix]
        return self.rows.at((0, batch, ix), context, part.attention, float(batch))

    def attention_prefill_s(self, batch: int, new: int, past: float, tokens: int) -> float:
        """``batch`` sequences of ``new`` tokens after ``past`` cached ones each. Chunks of more
        than 64 tokens interpolate between the 16-token grid of lengths too (the quadratic term's
        curvature over 16 tokens is below 1e-4 of the time)."""
        ix = self._part_ix[False][tokens]
        if new <= 64 or new % GRID == 0:
            return self._prefill_row(ix, batch, new, past)
        lo = new // GRID * GRID
        f = (new - lo) / GRID
        a = self._prefill_row(ix, batch, lo, past)
        return a + f * (self._prefill_row(ix, batch, lo + GRID, past) - a)

    def _prefill_row(self, ix: int, batch: int, new: int, past: float) -> float:
        part = self._arrays[3][ix]
        return self.rows.at((1, batch, new, ix), past, part.attention, float(batch), float(new))

    # Pricing ------------------------------------------------------------------------------
    def step_s(self, mix: Mix) -> float:
        tokens = mix.tokens
        if tokens > self.max_tokens:
            raise UserError(f"a step of {tokens} tokens exceeds the {self.max_tokens} the step model was "
                            f"compiled for (raise --max-num-tokens' bound or lower the batch)")
        if tokens == 0:
            return 0.0
        d, k = mix.decodes, mix.draft
        mean = mix.decode_context / d if d else 0.0
        if not mix.chunks:  # decodes alone: the engine's decode step
            t = self._dense_decode[tokens] + (self.attention_decode_s(d, mean, tokens) if k == 0 else
                                              self.attention_prefill_s(d, 1 + k, mean, tokens))
            return max(t, self._host_decode[tokens])
        t = self._dense_prefill[tokens] + self._head[mix.sequences]
        if d:
            t += self.attention_decode_s(d, mean, tokens) if k == 0 else \
                self.attention_prefill_s(d, 1 + k, mean, tokens)
        for c in mix.chunks:
            t += self.attention_prefill_s(1, c.tokens, c.past, tokens)
        return max(t, self._host_prefill[tokens])

    def host_floor_s(self, decode: bool, tokens: int) -> float:
        """The host's issue time of a step of ``tokens``' launches (0: a CUDA graph replays it), no loop idle."""
        host = (self._host_decode if decode else self._host_prefill)[tokens]
        return host - self._gap_s if decode and host else host

    def decode_s(self, decodes: int, context: int) -> float:
        """``step_s(Mix(decodes, context))`` without building the mix (the fast-forward's price)."""
        if decodes == 0 or decodes > self.max_tokens:
            return self.step_s(Mix(decodes, context))
        return max(self._dense_decode[decodes] + self.attention_decode_s(decodes, context / decodes, decodes),
                   self._host_decode[decodes])

    def decode_row(self, decodes: int, context: float) -> tuple[float, list[float], float] | None:
        """``(dense, row, host)``: ``decode_s(decodes, x) = max(dense + row at x / decodes (the grid cell's
        interpolation), host)`` for contexts ``x ≤ context``; None: not from a row."""
        if decodes == 0 or decodes > self.max_tokens:
            return None
        self.attention_decode_s(decodes, context / decodes, decodes)   # (the row grown to reach it)
        return (self._dense_decode[decodes], self.rows.live[(0, decodes, self._part_ix[True][decodes])],
                self._host_decode[decodes])

    @cached_property
    def _arrays(self) -> tuple:
        """The dense and head tables as arrays, every lowering's part in one list, and the index
        into it of each token count's part (decode graph, prefill graph)."""
        parts, index = [], []
        for compiled in (self._decode, self._prefill):
            ix = np.zeros(self.max_tokens + 1, dtype=np.int64)
            for part, tokens in compiled.values():
                ix[_at(tokens)] = len(parts)
                parts.append(part)
            index.append(ix)
        return (np.asarray(self._dense_decode), np.asarray(self._dense_prefill), np.asarray(self._head), parts, *index,
                np.asarray(self._host_decode), np.asarray(self._host_prefill))

    def step_s_array(self, decodes, decode_context, chunk_tokens, chunk_past, chunks, draft: int = 0) -> np.ndarray:
        """:meth:`step_s` elementwise (:class:`~perfcast.serving.types.StepCostArray`): the same
        tables, parts and 16-token grid, each distinct grid point priced once per call."""
        cols = np.broadcast_arrays(*(np.asarray(v, dtype=np.int64) for v in
                                     (decodes, decode_context, chunk_tokens, chunk_past, chunks)))
        shape = cols[0].shape
        d, ctx, t, p, c = (v.ravel() for v in cols)
        tokens = d * (1 + draft) + c * t
        top = int(tokens.max(initial=0))
        if top > self.max_tokens:
            raise UserError(f"a step of {top} tokens exceeds the {self.max_tokens} the step model was "
                            f"compiled for (raise --max-num-tokens' bound or lower the batch)")
        dense_decode, dense_prefill, head, parts, decode_ix, prefill_ix, host_decode, host_prefill = self._arrays
        mean = np.divide(ctx, d, out=np.zeros(d.shape), where=d > 0)
        mixed, has = c > 0, d > 0
        out = np.where(mixed, dense_prefill[tokens] + head[d + c], dense_decode[tokens])
        if draft == 0:
            out[has] += on_grid(parts, decode_ix[tokens[has]], (d[has],), mean[has])
        else:
            out[has] += prefill_on_grid(parts, prefill_ix[tokens[has]], d[has], np.full(has.sum(), 1 + draft),
                                         mean[has])
        out[mixed] += c[mixed] * prefill_on_grid(parts, prefill_ix[tokens[mixed]], np.ones(mixed.sum(), np.int64),
                                                  t[mixed], p[mixed])
        out = np.maximum(out, np.where(mixed, host_prefill[tokens], host_decode[tokens]))
        out[tokens == 0] = 0.0
        return out.reshape(shape)

    def step_many(self, decodes, decode_context, chunk_tokens, chunk_past) -> np.ndarray:
        """Vectorised, exact (no grid): steps of ``decodes`` sequences with ``decode_context``
        cached tokens in all and at most one prefill chunk (``chunk_tokens`` 0: none) each."""
        d, ctx, s, p = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in
                                             (decodes, decode_context, chunk_tokens, chunk_past)))
        tokens = (d + s).astype(int)
        if tokens.max(initial=0) > self.max_tokens:
            raise UserError(f"a step of {tokens.max()} tokens exceeds the {self.max_tokens} compiled for")
        out = np.zeros(d.shape)
        mean = np.divide(ctx, d, out=np.zeros_like(ctx), where=d > 0)
        pure = s == 0
        for decode, parts in ((True, self._decode), (False, self._prefill)):
            for part, toks in parts.values():
                m = np.isin(tokens, toks) & (pure if decode else ~pure) & (tokens > 0)
                if not m.any():
                    continue
                dm, cm, sm, pm_ = d[m], mean[m], s[m], p[m]
                if decode:
                    out[m] = np.maximum(part.dense(dm) + part.attention(dm, cm), part.host) + self._gap_s
                    continue
                t = part.dense(one := np.ones_like(sm), dm + sm) + part.head(dm + 1) + part.attention(one, sm, pm_)
                has = dm > 0
                if has.any():
                    t = np.where(has, t + decode_attention(self._decode, tokens[m], dm, cm), t)
                out[m] = np.maximum(t, part.host)
        return out


def _at(tokens: list[int]):
    """Where sorted ``tokens`` are in a table: a slice for a consecutive run, else the list."""
    return slice(tokens[0], tokens[-1] + 1) if tokens and tokens[-1] - tokens[0] == len(tokens) - 1 else tokens


def compile_step(deployment: Deployment, *, max_tokens: int = 16384):
    """The step model of ``deployment`` (:class:`StepModel`; with pipeline parallelism a
    :class:`~perfcast.serving.step_pipeline.PipelineStepModel`), memoised per process: one compiled
    for at least ``max_tokens`` is reused, so a search over batch limits compiles each once."""
    have = _COMPILED.get(deployment)
    if have is None or have.max_tokens < int(max_tokens):
        from perfcast.serving.step_pipeline import PipelineStepModel

        _COMPILED[deployment] = (PipelineStepModel if deployment.layout.pp > 1 else StepModel)(deployment,
                                                                                              max_tokens=max_tokens)
    return _COMPILED[deployment]


def compiled_models() -> MappingProxyType:
    """This process's step models by deployment (:func:`compile_step`'s memo), read-only."""
    return MappingProxyType(_COMPILED)


_COMPILED: dict = {}
