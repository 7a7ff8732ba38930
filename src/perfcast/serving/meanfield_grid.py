"""The closed loop over arrays of load points: :func:`perfcast.serving.meanfield.closed_loop`'s
figures for a whole grid of prompt lengths × batch limits × concurrencies in one call.

A *family* is everything of a point but its batch limit and concurrency: one step cost, one
engine (policy, token budget, chunking, KV capacity, speculative decoding), one prompt length,
output length and prefix hit rate. Within a family the mean field depends on the prompt rate ``r``
only through functions of an integer count, linear between integers (``meanfield._state``): the
decode step ``f(n)``, a prompt's extra cost ``ΔP(n)`` and chunk steps ``m(n)`` (vllm, trtllm) or
the prefill batch ``P(b)`` (sglang), at ``n = max(d, 1)`` decodes, ``d = r (osl − 1) / E``. So:

1. **tabulate** them once per family, for every count a point of the family can reach, on arrays
   (:class:`~perfcast.serving.types.StepCostArray`; any other step cost is asked count by count
   through the scalar path's own ``_Model``);
2. a point's engine state depends on the point only through the sequences it may hold,
   ``B = min(C, max_batch, ⌊KV / (isl + osl)⌋)``: each distinct (family, B) is solved once;
3. **segments**: between the ``r`` at which ``n`` (or sglang's ``b``) crosses an integer, and
   either side of the kink where a prompt's chunk steps carry ``m r = 1`` prompts' prefill, every
   interpolant is linear in ``r``, so ``(in flight(r) − B) · τ(r)`` is a polynomial of degree at
   most three. The in-flight count at the segment ends places each target in the segment of its
   first crossing (a binary search over their running maximum); Newton's method safeguarded by
   bisection (Press et al., Numerical Recipes, 3rd ed., §9.4, ``rtsafe``) finds the root to
   rounding; the state at the root is evaluated with the scalar path's formulas. The token-budget
   bound is taken as ``_engine_state`` takes it (the state at the top of the search, when it
   holds no more than ``B``);
4. the closed-loop figures of every point follow from its state in a few array operations, in
   ``closed_loop``'s order of operations.

The figures equal the scalar closed form's to the root searches' tolerance
(``tests/test_meanfield_grid.py``: relative difference ≤ 1e-9 point by point).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfcast.ir import UserError

from perfcast.serving.meanfield import EngineConfig, Workload, _Model, _r_budget
from perfcast.serving.meanfield_roots import _linear, _roots
from perfcast.serving.types import SLO, StepCost, StepCostArray


@dataclass(frozen=True)
class GridResult:
    """:func:`~perfcast.serving.meanfield.closed_loop`'s figures for every point (arrays of the
    points' broadcast shape; its latencies are deterministic, so each is its mean). ``budget_bound``:
    the token budget, not the sequences, bounds the engine; ``goodput_requests_per_s`` only under
    an SLO; ``states``: the distinct engine states solved for the grid."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    requests_per_s: np.ndarray
    output_tokens_per_s: np.ndarray
    output_tokens_per_s_per_device: np.ndarray
    output_tokens_per_s_per_user: np.ndarray
    mean_batch: np.ndarray
    kv_peak_tokens: np.ndarray
    budget_bound: np.ndarray
    goodput_requests_per_s: np.ndarray | None
    states: int


@dataclass(frozen=True)
class _Tables:
    """A set of families' interpolants, one row per family (column = count; padded with the last
    value so that an interpolation weight of zero reads a finite neighbour), and their limits."""

    sglang: bool
    osl: int
    e: float
    decode: np.ndarray           # f(n), decode steps (and their draft forwards)
    extra: np.ndarray | None     # ΔP(n), mixed policies
    steps: np.ndarray | None     # m(n), mixed policies
    prefill: np.ndarray | None   # P(b), sglang
    q: np.ndarray                # sglang's largest prefill batch per family

    @property
    def a(self) -> float:
        """Decodes per unit of prompt rate, ``(osl − 1) / E``."""
        return (self.osl - 1) / self.e


def closed_loop_grid(step: StepCost, engine: EngineConfig, isl, osl: int, concurrency, *, max_batch=None,
                     prefix_hit_rate: float = 0.0, draft: StepCost | None = None,
                     slo: SLO | None = None) -> GridResult:
    """``closed_loop(step, replace(engine, max_batch=max_batch[i]), Workload(isl[i], osl,
    concurrency=concurrency[i], prefix_hit_rate=…), draft=draft, slo=slo)`` for every ``i`` of the
    broadcast of ``isl``, ``concurrency`` and ``max_batch`` (``engine.max_batch`` when None). A
    layout is a step cost of its own: one call per layout. Refused as the scalar path refuses
    (the first family it refuses): a KV cache holding no request, a prompt over the token budget
    without chunked prefill, and the inputs ``EngineConfig`` and ``Workload`` refuse, and SGLang's
    recv interval above 1 (the scalar path's batching by interval is not tabulated here)."""
    if engine.recv_interval != 1:
        raise UserError(f"closed-form grid: SGLang recv interval {engine.recv_interval} is priced by "
                        f"meanfield.closed_loop only")
    if engine.coupled_ranks != 1 or engine.adp_balance is not None:
        raise UserError(f"closed-form grid: {engine.coupled_ranks} coupled attention-DP ranks (or TensorRT-LLM's "
                        f"attention-DP balance) are priced by meanfield.closed_loop only (their mean step and hold "
                        f"are not linear in the prompt rate)")
    isl = np.asarray(isl, dtype=np.int64)
    concurrency = np.asarray(concurrency, dtype=np.int64)
    max_batch = np.asarray(engine.max_batch if max_batch is None else max_batch, dtype=np.int64)
    shape = np.broadcast_shapes(isl.shape, concurrency.shape, max_batch.shape)
    if max_batch.size:  # refused as EngineConfig refuses it; the families' models hold the largest
        replace(engine, max_batch=int(max_batch.min()))
        engine = replace(engine, max_batch=int(max_batch.max()))
    least = int(concurrency.min()) if concurrency.size else None
    isls, inverse = np.unique(isl, return_inverse=True)
    models = [_Model(step, engine, Workload(int(i), osl, concurrency=least, prefix_hit_rate=prefix_hit_rate), draft)
              for i in isls]
    cap = np.array([m.cap for m in models], dtype=np.int64)
    for m in models:
        m.refuse_unchunkable()
    fam = np.broadcast_to(inverse.reshape(isl.shape), shape)
    c = np.broadcast_to(concurrency, shape)
    # the full engine of each point (its sequence limit), then, where the clients do not fill it,
    # the state holding them less those on their way in (closed_loop's two cases)
    full = np.minimum(max_batch, cap[fam])
    f_fam, f_held, f_at = _pairs(fam, full, len(models))
    tb, ends, r_budget = _tables(models, step, engine, osl, draft, f_fam, f_held)
    state, bound = _solve(tb, ends, r_budget, f_fam, f_held, 0)
    inflight, r, ttft_state, tau = (v[f_at] for v in state)
    bound = bound[f_at]
    lag = engine.take_in_lag
    part = inflight + lag * r > c
    if part.any():
        p_fam, p_held, p_at = _pairs(fam[part], c[part], len(models))
        p_state, p_bound = _solve(tb, ends, r_budget, p_fam, p_held, lag)
        for whole, v in zip((inflight, r, ttft_state, tau), p_state):
            whole[part] = v[p_at]
        bound[part] = p_bound[p_at]
    states = len(f_fam) + (len(p_fam) if part.any() else 0)

    e = models[0].e
    c = c.astype(float)
    x_state = r / tau
    ttft = np.maximum(c - inflight - lag * r, 0.0) / x_state + lag * tau + ttft_state
    tpot = tau / e
    e2e = ttft + (osl - 1) * tpot
    x = c / e2e
    good = None
    if slo is not None:
        meets = np.ones(shape, dtype=bool)
        for bound_s, value in ((slo.ttft_s, ttft), (slo.tpot_s, tpot), (slo.e2e_s, e2e)):
            if bound_s is not None:
                meets &= value <= bound_s
        good = np.where(meets, x, 0.0)
    per = np.broadcast_to(isl, shape) + osl
    return GridResult(
        ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, requests_per_s=x, output_tokens_per_s=x * osl,
        output_tokens_per_s_per_device=x * osl / engine.devices, output_tokens_per_s_per_user=1.0 / tpot,
        mean_batch=inflight,
        kv_peak_tokens=np.minimum(engine.kv_capacity_tokens, np.ceil(inflight * per)).astype(np.int64),
        budget_bound=bound, goodput_requests_per_s=good, states=states)


def _pairs(fam: np.ndarray, held: np.ndarray, families: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (family, count) pairs of the points, and each point's pair."""
    needed = np.zeros((families, int(held.max(initial=1)) + 1), dtype=bool)
    needed[fam, held] = True
    pair_fam, pair_held = np.nonzero(needed)
    pair = np.zeros(needed.shape, dtype=np.int64)
    pair[pair_fam, pair_held] = np.arange(len(pair_fam))
    return pair_fam, pair_held, pair[fam, held]


def _tables(models: list[_Model], step: StepCost, engine: EngineConfig, osl: int, draft: StepCost | None,
            fam: np.ndarray, held: np.ndarray) -> tuple[_Tables, tuple, np.ndarray]:
    """The families' interpolants and segment ends up to the highest prompt rate the full engines
    (``held`` sequences) can reach, and each family's token-budget rate."""
    r_budget = np.array([_r_budget(m) for m in models])
    r_top = np.zeros(len(models))
    np.maximum.at(r_top, fam, np.minimum(held * models[0].e / (osl - 1), r_budget[fam]))
    q = np.array([m.prefill_batch_max for m in models], dtype=np.int64)
    tb = _tabulate(models, step, engine, draft, r_top, q)
    return tb, _boundaries(tb, r_top), r_budget


def _solve(tb: _Tables, ends: tuple, r_budget: np.ndarray, fam: np.ndarray, held: np.ndarray,
           lag: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """For every pair, the state where the engine's in-flight count plus ``lag · r`` (requests on
    their way in) reaches ``held`` — ``_engine_state(model[fam], held)`` at ``lag`` 0 — as (in flight,
    r, TTFT service, τ), and whether the token budget bounds it."""
    r_hi = np.minimum(held / (tb.a + lag), r_budget[fam])
    *_, top = _state(tb, fam, r_hi)
    bound = top + lag * r_hi <= held
    solve = ~bound
    r = r_hi.copy()
    efam, er, einf = ends
    r[solve] = _roots(tb, (efam, er, einf + lag * er), fam[solve], held[solve].astype(float), lag)
    _, tau, ttft, inflight = _state(tb, fam, r)
    return (inflight, r, ttft, tau), bound


def _lerp(table: np.ndarray, fam: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``meanfield._lerp`` on arrays: linear between the integer neighbours (a weight of zero at an
    integer reads the padded neighbour, so ``y + 0 · (…) = y`` exactly)."""
    lo = np.floor(x)
    i = lo.astype(np.int64)
    y = table[fam, i]
    return y + (x - lo) * (table[fam, i + 1] - y)


def _state(tb: _Tables, fam: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, ...]:
    """``meanfield._state`` on arrays, in its order of operations: (d, τ, TTFT service, in flight)."""
    d = r * (tb.osl - 1) / tb.e
    n = np.maximum(d, 1.0)
    f = _lerp(tb.decode, fam, n)
    if tb.sglang:
        b = np.minimum(np.maximum(r, 1.0), tb.q[fam])
        p = _lerp(tb.prefill, fam, b)
        tau, ttft = f + r / b * p, p
    else:
        extra, steps = _lerp(tb.extra, fam, n), _lerp(tb.steps, fam, n)
        tau, ttft = f + r * extra, steps * f + extra * np.maximum(1.0, steps * r)
    return d, tau, ttft, d + r / tau * ttft


def _tabulate(models: list[_Model], step: StepCost, engine: EngineConfig, draft: StepCost | None,
              r_top: np.ndarray, q: np.ndarray) -> _Tables:
    """Each family's interpolants for every count up to where its highest prompt rate ``r_top``
    reaches: ``n = 1 … ⌈max(d(r_top), 1)⌉``, sglang's ``b = 1 … ⌈min(max(r_top, 1), q)⌉``."""
    m0 = models[0]
    osl, e, sglang = m0.load.osl, m0.e, engine.policy == "sglang"
    n_top = np.ceil(np.maximum(r_top * (osl - 1) / e, 1.0)).astype(np.int64)
    b_top = np.ceil(np.minimum(np.maximum(r_top, 1.0), q)).astype(np.int64) if sglang else n_top
    fam, n = _counts(n_top)
    batches = _counts(b_top) if sglang else None
    if isinstance(step, StepCostArray) and (draft is None or isinstance(draft, StepCostArray)):
        columns = _priced(models, step, engine, draft, fam, n, batches)
    else:
        columns = _asked(models, fam, n, batches)
    decode = _padded(columns[0], n_top)
    if sglang:
        return _Tables(True, osl, e, decode, None, None, _padded(columns[1], b_top), q)
    return _Tables(False, osl, e, decode, _padded(columns[1], n_top), _padded(columns[2], n_top), None, q)


def _counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and count ``1 … counts[row]`` of every entry, row by row."""
    row = np.repeat(np.arange(len(counts)), counts)
    return row, 1 + np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)


def _padded(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Row ``f`` holds ``values`` of counts ``1 … counts[f]`` at columns ``1 … counts[f]``; column 0
    and the columns past the last repeat the nearest count."""
    width = int(counts.max()) + 2
    col = np.clip(np.arange(width), 1, counts[:, None]) - 1
    return values[(np.cumsum(counts) - counts)[:, None] + col]


def _asked(models: list[_Model], fam: np.ndarray, n: np.ndarray,
           batches: tuple[np.ndarray, np.ndarray] | None) -> list[np.ndarray]:
    """The interpolants from the scalar path's own ``_Model`` functions, count by count."""
    def each(fn, rows, counts):
        return np.array([fn(models[f], int(k)) for f, k in zip(rows, counts)], dtype=float)

    if batches is not None:
        return [each(_Model.decode_s, fam, n), each(_Model.prefill_batch_s, *batches)]
    return [each(fn, fam, n) for fn in (_Model.decode_s, _Model.prompt_extra_s, _Model.prompt_steps)]


def _priced(models: list[_Model], step: StepCostArray, engine: EngineConfig, draft: StepCostArray | None,
            fam: np.ndarray, n: np.ndarray, batches: tuple[np.ndarray, np.ndarray] | None) -> list[np.ndarray]:
    """The interpolants priced on arrays, the mixes built as ``_Model`` builds them: decode steps
    of ``n`` decodes at the mean context (plus ``k`` draft forwards), a prompt's chunks after its
    cached prefix, of the budget left by the decodes (mixed), or whole prompts batched (sglang)."""
    k = engine.spec_k
    isl = np.array([m.load.isl for m in models], dtype=np.int64)
    hit = np.array([m.load.hit_tokens for m in models], dtype=np.int64)
    need = np.array([m.load.prefill_tokens for m in models], dtype=np.int64)
    osl = models[0].load.osl
    ctx = n * (2 * isl[fam] + osl - 2) // 2
    budget = engine.max_num_tokens
    if batches is not None:
        bfam, b = batches
        cfam, t, past = _chunked(np.arange(len(models)), need, hit, np.full(len(models), budget))
        whole, split = _at_once(step, 0, (0, 0, need[bfam], hit[bfam], b), (0, 0, t, past, 1))
        split = np.bincount(cfam, split, minlength=len(models))
        base, = _at_once(step, k, (n, ctx, 0, 0, 0))
        prefill = [np.where(need[bfam] > budget, split[bfam], whole)]
    else:
        left = np.minimum(budget, np.maximum(1, engine.step_tokens - n * (1 + k))) if engine.chunked_prefill \
            else need[fam]
        row, t, past = _chunked(np.arange(len(n)), need[fam], hit[fam], left)
        base, chunk = _at_once(step, k, (n, ctx, 0, 0, 0), (n[row], ctx[row], t, past, 1))
        prefill = [np.bincount(row, chunk - base[row], minlength=len(n)),
                   np.bincount(row, minlength=len(n)).astype(float)]
    decode = base + k * draft.step_s_array(n, ctx, 0, 0, 0) if draft is not None and k else base
    return [decode, *prefill]


def _at_once(step: StepCostArray, draft: int, *groups: tuple) -> list[np.ndarray]:
    """Groups of mixes ``(decodes, context, chunk tokens, chunk past, chunks)`` priced in one call
    (a step model evaluates each distinct attention grid point once per call)."""
    sizes = [np.broadcast(*g).size for g in groups]
    columns = [np.concatenate([np.broadcast_to(g[i], (size,)) for g, size in zip(groups, sizes)]) for i in range(5)]
    return np.split(step.step_s_array(*columns, draft), np.cumsum(sizes)[:-1])


def _chunked(rows: np.ndarray, need: np.ndarray, hit: np.ndarray, budget: np.ndarray) -> tuple[np.ndarray, ...]:
    """``_Model.chunks`` on arrays: per row, chunks of ``budget`` tokens (the last the rest) of the
    ``need`` prompt tokens after the ``hit`` cached ones, as (row, tokens, past)."""
    count = -(-need // budget)
    row, j = _counts(count)
    j -= 1
    return rows[row], np.minimum(need[row] - j * budget[row], budget[row]), hit[row] + j * budget[row]


def _boundaries(tb: _Tables, r_top: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every family's segment ends in ``[0, r_top]``, sorted by (family, r): the rates where the
    decode count (or sglang's batch) crosses an integer, where a mixed policy's chunk steps carry
    ``m r = 1`` prompts, and the ends. Returned with the in-flight count there."""
    families = np.arange(len(r_top))
    n_top = np.ceil(np.maximum(r_top * tb.a, 1.0)).astype(np.int64)
    fam, i = _counts(n_top)
    cuts = [(families, np.zeros(len(r_top))), (families, r_top), (fam, i / tb.a)]
    if tb.sglang:
        fam, j = _counts(np.minimum(tb.q, np.floor(r_top)).astype(np.int64))
        cuts.append((fam, j.astype(float)))
    else:
        fam, r = _sorted(cuts, r_top)
        same = fam[1:] == fam[:-1]
        lo, hi, fam = r[:-1][same], r[1:][same], fam[:-1][same]
        s0, s1 = _linear(tb.steps, fam, (lo + hi) / 2 * tb.a, tb.a)
        with np.errstate(divide="ignore", invalid="ignore"):
            root = np.sqrt(s0 * s0 + 4 * s1)
            kink = np.where(s0 > 0, 2 / (s0 + root), (root - s0) / (2 * s1))
        inside = (kink > lo) & (kink < hi)
        cuts.append((fam[inside], kink[inside]))
    fam, r = _sorted(cuts, r_top)
    return fam, r, _state(tb, fam, r)[3]


def _sorted(cuts: list[tuple[np.ndarray, np.ndarray]], r_top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (family, r) cuts within ``[0, r_top]``, sorted and without repeats."""
    fam = np.concatenate([f for f, _ in cuts])
    r = np.concatenate([v for _, v in cuts])
    keep = r <= r_top[fam]
    fam, r = fam[keep], r[keep]
    order = np.lexsort((r, fam))
    fam, r = fam[order], r[order]
    new = np.ones(len(r), dtype=bool)
    new[1:] = (fam[1:] != fam[:-1]) | (r[1:] != r[:-1])
    return fam[new], r[new]
