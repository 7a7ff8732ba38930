"""Measured serving runs (aiconfigurator-core's ``silicon_sample.csv``) mapped to perfcast steps.

A row states a deployment (system, model, backend, quantization, layout), a workload (input and
output lengths, the batch in flight) and what was measured (TTFT and TPOT in ms). :func:`map_row`
turns it into a :class:`Case`: the perfcast request of its decode step and of its prefill, or
the reason it cannot be priced — never a guess. The tables that name things (systems, models,
backends, quantization modes) are data (``perfcast/data/validation/mapping.yaml``); the rest of
the mapping is written here and in docs/design/validation.md:

- **batch**: aiconfigurator gives the batch per attention-data-parallel rank (``batch_size``, or
  ``decode_batch_size`` for the decode workers of a disaggregated run); the step holds
  ``batch × attention_dp_size`` sequences over its data-parallel ranks (aiconfigurator-core
  0.12.0 ``sdk/config.py``: ``tp_size · attention_dp_size = moe_tp_size · moe_ep_size``).
- **context**: the mean over the request's decode steps, ``isl + osl/2`` (rounded down).
- **layout**: ``tp × attention_dp × pp`` devices; for an MoE model the experts are split over
  ``moe_ep`` (perfcast derives ``moe_tp`` = the MoE group / ``ep`` and the row must agree); a
  dense model's attention-DP ranks are independent replicas. perfcast's own layout check
  (:func:`perfcast.capture.parallel.check`) refuses what it cannot take, and its line is the reason.
  Two collections state an expert-parallel run's layout as the product of its GPUs and its expert
  parallelism; their aggregated rows are read back as the run had them (:func:`_restated`).
  Disaggregated rows whose worker pools ran attention DP the row drops are read back from the
  campaign's config (:func:`_dp_attention`).
- **disaggregated** rows: the decode workers' layout and batch (``decode_*`` columns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from perfcast.capture.parallel import Layout, experts_of
from perfcast.engines.apply import merged_options
from perfcast.hardware.spec import SpecError
from perfcast.inference import multinode
from perfcast.inference.silicon_file import (  # noqa: F401  (the file's API, as silicon.* too)
    COLUMNS, WORKER_COLUMNS, _data, _int, benchmark_of, collection_of, convert, manifest, read, shipped_path)
from perfcast.ir import UserError
from perfcast.models import load_model_config
from perfcast.models.quant_configs import read as read_quantization
from perfcast.perf.databases import version_key

if TYPE_CHECKING:  # pandas is imported where the rows are read: the serving layer needs none of it
    import pandas as pd

#: ``static``: a static batch (TensorRT-LLM's gptSessionBenchmark, the published
#: performance tables before v0.10): one prefill of the whole batch, then its decode steps.
MODES = ("agg", "disagg", "static")


@lru_cache(maxsize=None)
def tables() -> dict:
    """The mapping tables (systems, models, backends, quantization)."""
    return _data("mapping.yaml")


@dataclass(frozen=True)
class Case:
    """One measured run and the perfcast step it maps to (``reason`` None), or why it cannot be
    priced. ``batch`` is per attention-DP rank; the step holds ``num_queries`` sequences."""

    id: str
    system: str
    model_path: str
    backend: str
    backend_version: str
    mode: str
    isl: int
    osl: int
    concurrency: int
    tpot_ms: float
    ttft_ms: float
    family: str
    model: str | None = None
    device: str | None = None
    engine: str | None = None
    quantize: str | None = None
    layout: Layout | None = None
    batch: int = 0
    reason: str | None = None
    approximate: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    dtype: str = "bf16"
    kv_dtype: str | None = None
    benchmark: str = "gap-analysis"     # which client measured it (:func:`benchmark_of`)
    prefill_layout: Layout | None = None  # disaggregated: the prefill workers' layout, as stated
    prefill_workers: int | None = None
    decode_workers: int | None = None
    max_num_tokens: int | None = None     # the campaign's step token budget (perfcast.inference.recipes)
    batch_wait: tuple[int, float] | None = None  # its TensorRT-LLM batch waiting
    memory_fraction: float | None = None  # its engine memory fraction
    engine_options: tuple[tuple[str, str], ...] = ()  # its engine options (e.g. TensorRT-LLM's MoE backend)
    recv_interval: int | None = None      # its SGLang --scheduler-recv-interval
    overlap: bool | None = None           # its engine's overlap scheduling (None: the profile's default)
    cuda_graph_max: int | None = None     # its decode workers' largest CUDA graph (None: the engine's)
    adp_balance: tuple[int, int] | None = None  # its TensorRT-LLM attention_dp_config enable_balance
    max_prefill_tokens: int | None = None  # its SGLang --max-prefill-tokens (None: the engine's, 16384)

    @property
    def num_queries(self) -> int:
        return self.batch * (self.layout.dp if self.layout else 1)

    @property
    def batch_limits(self) -> bool:
        """Whether the serving replay takes the row's batch as the engine's max batch: not for an
        aggregated row whose batch (× attention-DP ranks) is below its concurrency
        (:func:`perfcast.inference.recipes.with_batch_limit`)."""
        return not (self.mode == "agg" and self.layout is not None and self.concurrency > self.num_queries)

    @property
    def context(self) -> int:
        """Tokens in each sequence's KV cache at the mean decode step: ``isl + osl/2``."""
        return self.isl + self.osl // 2

    @property
    def predictable(self) -> bool:
        return self.reason is None


def _float(row: dict, col: str) -> float:
    """The value, or NaN where the row states none (a refusal reason, not an error)."""
    text = str(row.get(col, "")).strip()
    if not text:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"row {row.get('id', '?')}: column {col}: {text!r} is not a number") from None
    return value if math.isfinite(value) and value > 0 else math.nan


@lru_cache(maxsize=None)
def catalog_model(name: str):
    """A catalog model's config, loaded once per run."""
    return load_model_config(name)


def _quantization(row: dict, entry: dict, cfg: dict) -> tuple[str | None, str | None, tuple, tuple, str | None]:
    """(the catalog config priced, perfcast --quantize, notes, what is approximate, refusal reason).

    The model path names a checkpoint; the row's ``gemm_quant_mode`` / ``moe_quant_mode`` say
    which of its family's checkpoints the engine served. Where the model's ``checkpoints`` table
    names a shipped config for both modes, that config is priced as its quantization_config
    says (no --quantize); otherwise the row's modes are the quantization (--quantize, per module
    group where the two modes differ: the GEMM mode for attention and dense MLPs, the MoE mode
    for the routed experts)."""
    table = tables()["quantization"]
    modes = [str(row.get(c, "")).strip() or "none" for c in ("gemm_quant_mode", "moe_quant_mode")]
    for m in modes:
        if m not in table:
            return None, None, (), (), f"unknown quantization mode {m!r} (known: {', '.join(table)})"
    if not experts_of(cfg):
        modes = modes[:1]  # a dense model has no MoE layer for moe_quant_mode to describe
    served = {(entry.get("checkpoints") or {}).get(m) for m in modes}
    if len(served) == 1 and None not in served:
        config = served.pop()
        sibling = entry.get("checkpoints_approximate") or {}  # a sibling's config stands in for the served one
        approx = tuple(dict.fromkeys(f"{m}: {' '.join(sibling[m].split())}" for m in modes if m in sibling))
        return config, None, (f"quantization: {config}'s own (the row says {' / '.join(modes)})",), approx, None
    schemes = [table[m]["quantize"] or "none" for m in modes]
    if len(set(schemes)) == 1:
        flag = None if schemes[0] == "none" and not _quantized(entry["catalog"]) else schemes[0]
    else:
        flag = f"attention={schemes[0]},mlp={schemes[0]},experts={schemes[1]}"
    approx = tuple(dict.fromkeys(f"{m}: {table[m]['approximate']}" for m in modes if table[m].get("approximate")))
    note = (f"quantization: the row's {' / '.join(modes)} (--quantize {flag})",) if flag else ()
    return entry["catalog"], flag, note, approx, None


@lru_cache(maxsize=None)
def _quantized(name: str) -> bool:
    """Whether a catalog config states a quantization of its own (then bf16 is --quantize none)."""
    return read_quantization(catalog_model(name)).quantized


#: A disaggregated row that states neither the decode batch nor the decode workers: the decode
#: workers together hold every concurrent request (disaggregated serving moves a request to a
#: decode worker for its whole decode phase: NVIDIA Dynamo / TRT-LLM disaggregated serving docs),
#: and with the number of workers unstated, one worker holding them all is the assumption —
#: an upper bound on its batch, so the row is priced and labelled approximate.
ONE_DECODE_WORKER = ("disagg: decode_batch_size and decode_num_workers not stated: one decode worker "
                     "holds all concurrent requests (an upper bound on its batch)")


def _layout(row: dict, cfg: dict, disagg: bool, pre: str | None = None
            ) -> tuple[Layout | None, int, str | None, tuple[str, ...]]:
    """(layout, batch per attention-DP rank, refusal reason, assumptions) of the step's workers
    (``pre``: the columns' prefix, default the decode workers' of a disaggregated row)."""
    pre = ("decode_" if disagg else "") if pre is None else pre
    batch = _int(row, f"{pre}batch_size")
    tp = _int(row, f"{pre}tp_size")
    assumed: tuple[str, ...] = ()
    if (batch is None or batch < 1) and disagg and _int(row, "concurrency"):
        # the concurrent requests over the decode workers' attention-DP ranks (the campaign's database
        # dump states its decode batch so); one worker where the row does not say how many
        adp = _int(row, "decode_attention_dp_size", default=1, zero_is_unset=True)
        workers = _int(row, "decode_num_workers", default=None, zero_is_unset=True)
        batch = -(-_int(row, "concurrency") // (adp * (workers or 1)))
        assumed = () if workers else (ONE_DECODE_WORKER,)
    if batch is None or batch < 1:
        return None, 0, f"{row['mode']}: no {pre}batch_size (the batch of the step is not stated)", ()
    if tp is None or tp < 1:
        return None, batch, f"{row['mode']}: no {pre}tp_size (the layout of the step is not stated)", ()
    pp = _int(row, f"{pre}pp_size", default=1, zero_is_unset=True)
    adp = _int(row, f"{pre}attention_dp_size", default=1, zero_is_unset=True)
    moe_tp = _int(row, f"{pre}moe_tp_size", default=None, zero_is_unset=True)
    ep = _int(row, f"{pre}moe_ep_size", default=1, zero_is_unset=True)
    if not experts_of(cfg):
        if ep > 1:
            return None, batch, f"layout: moe_ep_size {ep} for a model without routed experts", ()
        return Layout(tp=tp, dp=adp, pp=pp), batch, None, assumed
    if moe_tp is not None and moe_tp * ep != tp * adp:
        # aiconfigurator-core 0.12.0 sdk/config.py requires tp · attention_dp = moe_tp · moe_ep
        return None, batch, (f"layout: {pre}moe_tp_size {moe_tp} × {pre}moe_ep_size {ep} ≠ {pre}tp_size {tp} × "
                             f"{pre}attention_dp_size {adp} (the row breaks aiconfigurator's own constraint)"), ()
    return Layout(tp=tp, ep=ep, dp=adp, pp=pp, attention_dp=adp > 1), batch, None, assumed


#: The note of a row whose stated layout is read as its collection's product of the run's GPUs and
#: expert parallelism (``product_layouts`` in mapping.yaml).
LAYOUT_NOTE = "layout restated"


def _restated(row: dict) -> tuple[dict, str | None, str | None]:
    """(the row, with its layout columns as the run had them, the note saying so, and what of it
    is assumed) for an aggregated row of a collection that states expert-parallel layouts as a
    product (mapping.yaml ``product_layouts``); the row as it is otherwise. The batch column is
    per attention-DP rank, so the step's sequences (batch × ranks) are kept."""
    spec = tables().get("product_layouts") or {}
    if row.get("mode") != "agg" or row.get("collection") not in spec.get("collections", ()):
        return row, None, None
    tp, batch = _int(row, "tp_size"), _int(row, "batch_size")
    adp = _int(row, "attention_dp_size", default=1, zero_is_unset=True)
    moe_tp = _int(row, "moe_tp_size", default=1, zero_is_unset=True)
    ep = _int(row, "moe_ep_size", default=1, zero_is_unset=True)
    if not tp or not batch or ep < 2:
        return row, None, None
    assumed = None
    if moe_tp > 1 and tp * adp == moe_tp * ep and moe_tp % ep == 0:  # the SGLang / TensorRT-LLM form
        gpus, experts, dp = moe_tp, ep, adp > 1
    elif moe_tp == 1 and tp == adp > 1 and ep == tp * adp:  # the vLLM form
        gpus, experts, dp, assumed = tp, adp, False, f"{LAYOUT_NOTE}: {spec['approximate_vllm']}"
    else:
        return row, None, None
    ranks = gpus if dp else 1
    real = {"tp_size": 1 if dp else gpus, "attention_dp_size": ranks, "moe_tp_size": gpus // experts,
            "moe_ep_size": experts, "batch_size": -(-batch * adp // ranks)}
    note = (f"{LAYOUT_NOTE}: collection {row['collection']} states tp {tp} × attention DP {adp}, moe_tp "
            f"{moe_tp} × moe_ep {ep}, the product of the run's {gpus} GPUs and its expert parallelism "
            f"{experts}; priced as tp {real['tp_size']}" + (f" × attention DP {ranks}" if dp else "")
            + f", moe_ep {experts} on {gpus} GPUs (mapping.yaml product_layouts)")
    return {**row, **{k: str(v) for k, v in real.items()}}, note, assumed


def _dp_attention(row: dict) -> tuple[dict, str | None]:
    """(the row, with the layout columns of each worker pool that ran attention DP the row does not
    state, and the note saying so) for a disaggregated row matching an entry of mapping.yaml
    ``attention_dp_layouts``; the row as it is otherwise."""
    if row.get("mode") != "disagg":
        return row, None
    for entry in tables().get("attention_dp_layouts") or ():
        if ((row["model_path"], row.get("backend"), row.get("system")) != (entry["model_path"], entry["backend"],
                                                                          entry["system"])
                or [_int(row, "isl"), _int(row, "osl")] not in entry["lengths"]):
            continue
        pools = {pre: entry[pre.rstrip("_")] for pre in ("prefill_", "decode_")}
        if any((_int(row, f"{pre}num_workers"), _int(row, f"{pre}tp_size"), _int(row, f"{pre}moe_ep_size"))
               != (p["workers"], p["tp"], p["ep"]) for pre, p in pools.items()):
            continue
        real, said = {}, []
        for pre, p in pools.items():
            if not p["dp_attn"] or (_int(row, f"{pre}attention_dp_size", default=1, zero_is_unset=True) or 1) > 1:
                continue
            batch = _int(row, f"{pre}batch_size")
            real |= {f"{pre}tp_size": 1, f"{pre}attention_dp_size": p["tp"], f"{pre}moe_tp_size": p["tp"] // p["ep"],
                     **({f"{pre}batch_size": -(-batch // p["tp"])} if batch else {})}
            said.append(f"{pre.rstrip('_')} tp {p['tp']} → tp 1 × attention DP {p['tp']}, moe_ep {p['ep']}")
        if not real:
            return row, None
        note = (f"{LAYOUT_NOTE}: the campaign's config ran attention DP the row does not state: "
                f"{'; '.join(said)} (mapping.yaml attention_dp_layouts: {entry['source'].split(' (')[0]})")
        return {**row, **{k: str(v) for k, v in real.items()}}, note
    return row, None


def _earlier_release(base: Case, engine: dict, row: dict) -> Case:
    """The engine defaults of an earlier release: the synchronous loop before ``synchronous_before``,
    each ``options_before`` entry's engine options. A nightly tag sorts after every release; an unstated
    version is dated by the row's day against the entry's ``merged`` (no release before it had it)."""
    v, day, said = base.backend_version, str(row.get("measured") or "9"), f"{base.backend} {base.backend_version}"
    older = lambda r: version_key(v) < version_key(r["version"]) if v != "unstated" else day < r.get("merged", "")  # noqa: E731
    if (sync := engine.get("synchronous_before")) and older(sync):
        base = replace(base, overlap=False, notes=base.notes + (
            f"{said} < {sync['version']}: a synchronous scheduling loop ({sync['source']})",))
    for r in (r for r in engine.get("options_before", ()) if older(r)):
        base = replace(base, engine_options=merged_options(base.engine_options, r["options"]),
                       notes=base.notes + (f"{said} (measured {row.get('measured') or '?'}) < {r['version']}: {r['source']}",))
    return base


def map_row(row: dict) -> Case:
    """The perfcast step of one measured run, or the reason it cannot be priced. Reasons are
    checked in a fixed order: device, model, backend, quantization, layout, a campaign's speculative
    run (its multi-node configs: :func:`perfcast.inference.multinode.resolve`; its single-node scripts:
    :func:`perfcast.inference.recipes.speculative_run`), then perfcast's own request check (its error
    line, e.g. fp4 on a device without an fp4 rate)."""
    t = tables()
    path, system = row["model_path"], row["system"]
    entry = t["models"].get(path)
    family = entry["catalog"] if entry and entry.get("catalog") else path.split("/")[-1]
    base = Case(id=row["id"], system=system, model_path=path, backend=row["backend"],
                backend_version=row.get("backend_version", "") or "unstated", mode=row["mode"],
                isl=_int(row, "isl") or 0, osl=_int(row, "osl") or 0,
                concurrency=_int(row, "concurrency") or 0, tpot_ms=_float(row, "silicon_tpot_ms"),
                ttft_ms=_float(row, "silicon_ttft_ms"), family=family,
                benchmark=row.get("benchmark") or "gap-analysis")
    sys_entry = t["systems"].get(system)
    if not sys_entry or not sys_entry.get("device"):
        return replace(base, reason=f"unknown device {system}")
    base = replace(base, device=sys_entry["device"])
    if entry is None:
        return replace(base, reason=f"unknown model {path} (not in perfcast's mapping table)")
    if not entry.get("catalog"):
        return replace(base, reason=f"unsupported architecture {entry['model_type']}")
    notes = (f"{path} → {entry['catalog']}: {entry['note']}",) if entry.get("note") else ()
    base = replace(base, model=entry["catalog"], notes=notes)
    engine = t["backends"].get(base.backend)
    if engine is None:
        return replace(base, reason=f"unknown backend {base.backend} (known: {', '.join(t['backends'])})")
    base = _earlier_release(replace(base, engine=engine.get("by_version", {}).get(base.backend_version,
                                                                                  engine["engine"])), engine, row)
    if base.mode not in MODES:
        return replace(base, reason=f"unknown mode {base.mode!r} (expected {', '.join(MODES)})")
    first_token_only = base.mode == "static" and base.osl == 1 and math.isfinite(base.ttft_ms)
    if base.isl < 1 or not (first_token_only or (base.osl >= 2 and math.isfinite(base.tpot_ms))):
        return replace(base, reason="no isl, osl ≥ 2 and measured TPOT in the row")
    for col in ("dtype", "kv_cache_dtype"):
        if row.get(col) and row[col] not in ("bf16", "fp16", "fp8"):
            return replace(base, reason=f"column {col}: {row[col]!r} (expected bf16, fp16 or fp8)")
    base = replace(base, dtype=row.get("dtype") or "bf16", kv_dtype=row.get("kv_cache_dtype") or None)
    config, quantize, qnotes, approx, why = _quantization(row, entry, catalog_model(base.model).data)
    if why:
        return replace(base, reason=why)
    base = replace(base, model=config, quantize=quantize, approximate=approx, notes=base.notes + qnotes)
    row, restated, guessed = _restated(row)
    if restated:
        base = replace(base, notes=base.notes + (restated,),
                       approximate=base.approximate + ((guessed,) if guessed else ()))
    row, dp_note = _dp_attention(row)
    if dp_note:
        base = replace(base, notes=base.notes + (dp_note,))
    configs = multinode.resolve(row)
    row = configs.row
    base = replace(base, notes=base.notes + ((configs.note,) if configs.note else ()),
                   approximate=base.approximate + tuple(x for x in (configs.merged, configs.either) if x))
    layout, batch, why, assumed = _layout(row, catalog_model(base.model).data, base.mode == "disagg")
    base = replace(base, layout=layout, batch=batch, approximate=base.approximate + assumed)
    if why or configs.reason:
        return replace(base, reason=why or configs.reason)
    if not base.concurrency:
        base = replace(base, concurrency=base.num_queries)
    from perfcast.inference.recipes import speculative_run, with_batch_limit, with_recipe

    if base.benchmark == "inferencex" and base.mode == "agg":  # the recipes are single-node servers' scripts
        why, either = speculative_run(base.model_path, base.backend, base.system, row.get("precision", ""),
                                      row.get("image", ""), row.get("measured", ""), base.layout.tp)
        if why:
            return replace(base, reason=why)
        base = replace(base, approximate=base.approximate + ((either,) if either else ()))
        base = with_recipe(base, row.get("precision", ""))
    base = multinode.with_limits(multinode.with_recipe(with_batch_limit(base), configs.recipe), configs.limits)
    if base.mode == "disagg":
        pre_layout, _, why_p, _ = _layout(row, catalog_model(base.model).data, True, "prefill_")
        base = replace(base, prefill_layout=None if why_p else pre_layout,
                       prefill_workers=_int(row, "prefill_num_workers", default=None, zero_is_unset=True),
                       decode_workers=_int(row, "decode_num_workers", default=None, zero_is_unset=True))
    from perfcast.inference.steps import case_request

    try:
        for decode in phases(base):
            case_request(base, decode=decode).validate()
    except (UserError, SpecError) as e:
        return replace(base, reason=f"refused by perfcast: {e}")
    return base


def phases(case: Case) -> tuple[bool, ...]:
    """The steps a case needs (``True``: its decode step, ``False``: its prefill): both for an
    aggregated or a static-batch run, the decode step for a disaggregated one, the prefill alone
    for a static first-token measurement (``osl`` 1)."""
    if case.mode == "disagg":
        return (True,)
    if case.mode == "static" and case.osl < 2:
        return (False,)
    return (True, False)


def map_frame(frame: pd.DataFrame) -> list[Case]:
    return [map_row(r) for r in frame.to_dict("records")]
