"""The engine settings a measured row is replayed with: those its campaign's launch scripts state
(``data/validation/inferencex_recipes.yaml``: the KV-cache dtype, the step token budget, the
memory fraction, TensorRT-LLM's batch waiting, SGLang's scheduler recv interval and engine
options such as vLLM's MXFP4 MoE activations of the InferenceX scripts, in place of the
engine's defaults), whether the row's batch is the engine's batch limit, and which rows the
campaign's speculative-decoding scripts measured (:func:`speculative_run`). Transcribed launch
flags and config keys, each with its script and commit; nothing fitted."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from perfcast.inputs import checked_number
from perfcast.inputs.yamlfile import load_yaml
from perfcast.ir import UserError

if TYPE_CHECKING:
    from perfcast.inference.silicon import Case

RECIPES = "inferencex_recipes.yaml"
#: how a case's note naming its campaign's settings begins
RECIPE_NOTE = "engine settings of the InferenceX script"


@dataclass(frozen=True)
class Recipe:
    kv_cache_dtype: str | None
    max_num_tokens: int | None
    batch_wait: tuple[int, float] | None
    memory_fraction: float | None
    source: str
    engine_options: tuple[tuple[str, str], ...] = ()
    recv_interval: int | None = None
    cuda_graph_max: int | None = None   # the script's largest decode CUDA graph (its concurrency: every batch)
    adp_balance: tuple[int, int] | None = None  # TensorRT-LLM attention_dp_config (batching_wait_iters, timeout_iters)
    max_prefill_tokens: int | None = None  # SGLang --max-prefill-tokens


@lru_cache(maxsize=None)
def _doc() -> dict:
    from importlib import resources

    doc = load_yaml(str(resources.files("perfcast.data") / "validation" / RECIPES))
    if not isinstance(doc, dict):
        raise UserError(f"{RECIPES}: expected a mapping with a 'recipes' list")
    return doc


def campaign_model(model_path: str) -> str:
    """The model path the campaign's scripts ran for a row's ``model_path`` (``campaign_models`` of
    the recipes: its database dump names DeepSeek-R1's runs ``deepseek-ai/DeepSeek-V3``)."""
    aliases = _doc().get("campaign_models") or {}
    if not isinstance(aliases, dict):
        raise UserError(f"{RECIPES}: campaign_models: expected a mapping of model path to model path")
    return aliases.get(model_path, model_path)


def _matches(e: dict, model_path: str, backend: str, system: str, precision: str) -> bool:
    return (e["model_path"], e["backend"]) == (campaign_model(model_path), backend) and system in e["systems"] \
        and precision in e["precisions"]


#: the recipes' sections: images only a speculative script ran; images its plain twin ran too
SPECULATIVE, SHARED = "speculative_runs", "speculative_or_plain"
#: how the approximate label of a row either twin may have measured begins
SHARED_NOTE = "speculative or plain"


@lru_cache(maxsize=None)
def _speculative_entries(section: str) -> tuple[dict, ...]:
    entries = _doc().get(section) or []
    if not isinstance(entries, list):
        raise UserError(f"{RECIPES}: {section}: expected a list")
    keys = ("model_path", "backend", "systems", "precisions", "images", "method", "source")
    for k, e in enumerate(entries):
        for key in keys + (("since",) if section == SHARED else ()):
            if not e.get(key):
                raise UserError(f"{RECIPES}: {section}[{k}]: missing {key}")
        if "measured" in e and not (isinstance(e["measured"], list) and all(isinstance(d, str) for d in e["measured"])):
            raise UserError(f"{RECIPES}: {section}[{k}]: measured: expected a list of dates (YYYY-MM-DD, quoted)")
        if "tp" in e and not (isinstance(e["tp"], list) and e["tp"] and all(isinstance(t, int) and t > 0 for t in e["tp"])):
            raise UserError(f"{RECIPES}: {section}[{k}]: tp: expected a list of tensor-parallel sizes")
    return tuple(entries)


def speculative_run(model_path: str, backend: str, system: str, precision: str, image: str,
                    measured: str = "", tp: int = 0) -> tuple[str | None, str | None]:
    """(why a row is not priced, what is approximate about it) from its container image and date:
    not priced where only the campaign's speculative script ran that image, or on that day (an
    entry's ``measured``: ``speculative_runs``; its TPOT depends on an acceptance rate neither the
    row nor the campaign states); priced as the
    plain script's and labelled approximate where both twins ran it on or after the speculative
    key's first day, or on an unstated day, at the tensor-parallel sizes the speculative script runs
    (an entry's ``tp``, where it states one: ``speculative_or_plain``)."""
    if not image:
        return None, None
    for e in _speculative_entries(SPECULATIVE):
        if image in e["images"] and _matches(e, model_path, backend, system, precision) \
                and measured in e.get("measured", [measured]):
            only = f"on {measured}" if e.get("measured") else "which"
            return (f"ran speculative decoding, {' '.join(e['method'].split())} (image {image}, {only} only the "
                    f"campaign's speculative script ran: {RECIPES} {SPECULATIVE}); the row states no acceptance "
                    f"rate, on which its TPOT depends"), None
    for e in _speculative_entries(SHARED):
        if image in e["images"] and _matches(e, model_path, backend, system, precision) \
                and (not measured or measured >= str(e["since"])) and tp in e.get("tp", [tp]):
            return None, (f"{SHARED_NOTE}: the campaign's {' '.join(e['method'].split())} script and its plain twin "
                          f"both ran image {image} from {e['since']} ({RECIPES} {SHARED}); priced as the plain one")
    return None, None


@lru_cache(maxsize=None)
def _entries() -> tuple[dict, ...]:
    entries = _doc().get("recipes")
    if not isinstance(entries, list):
        raise UserError(f"{RECIPES}: expected a 'recipes' list")
    for k, e in enumerate(entries):
        where = f"{RECIPES}: recipes[{k}]"
        for key in ("model_path", "backend", "systems", "precisions", "source"):
            if not e.get(key):
                raise UserError(f"{where}: missing {key}")
        if e.get("kv_cache_dtype") not in (None, "bf16", "fp16", "fp8"):
            raise UserError(f"{where}: kv_cache_dtype {e['kv_cache_dtype']!r} (expected bf16, fp16 or fp8)")
        mnt = e.get("max_num_tokens")
        if isinstance(mnt, dict):
            if set(mnt) != set(_BUDGET_KEYS):
                raise UserError(f"{where}: max_num_tokens: expected a count or a mapping of {', '.join(_BUDGET_KEYS)}")
            for key in _BUDGET_KEYS:
                checked_number(mnt[key], f"{where}: max_num_tokens.{key}", integer=True, positive=True)
        elif mnt is not None:
            checked_number(mnt, f"{where}: max_num_tokens", integer=True, positive=True)
        if e.get("memory_fraction") is not None:
            checked_number(e["memory_fraction"], f"{where}: memory_fraction", positive=True, maximum=1)
        if e.get("max_prefill_tokens") is not None:
            if e["backend"] != "sglang":
                raise UserError(f"{where}: max_prefill_tokens: SGLang's --max-prefill-tokens; backend {e['backend']} "
                                f"has none")
            checked_number(e["max_prefill_tokens"], f"{where}: max_prefill_tokens", integer=True, positive=True)
        bw = e.get("batch_wait")
        if bw is not None:
            for key in ("isl", "osl", "tp_below", "timeout_iters"):
                checked_number(bw.get(key), f"{where}: batch_wait.{key}", integer=True, minimum=0)
            checked_number(bw.get("max_tokens_ratio"), f"{where}: batch_wait.max_tokens_ratio", minimum=0, maximum=1)
        ab = e.get("attention_dp_balance")
        if ab is not None:
            if not isinstance(ab, dict) or set(ab) != {"batching_wait_iters", "timeout_iters"}:
                raise UserError(f"{where}: attention_dp_balance: expected batching_wait_iters and timeout_iters")
            for key in ab:
                checked_number(ab[key], f"{where}: attention_dp_balance.{key}", integer=True, minimum=0)
        for j, rule in enumerate(e.get("scheduler_recv_interval") or ()):
            at = f"{where}: scheduler_recv_interval[{j}]"
            if not isinstance(rule, dict) or set(rule) - {"tp", "concurrency_below", "value"}:
                raise UserError(f"{at}: expected a mapping of value with optional tp and concurrency_below")
            for key in rule:
                checked_number(rule[key], f"{at}.{key}", integer=True, positive=True)
        mb = e.get("moe_backend")
        if mb is not None:
            from perfcast.engines import get_engine

            option = get_engine(e["backend"]).options.get("moe_backend")
            choices = option.choices if option is not None else []
            if not isinstance(mb, dict) or set(mb) - {"without_attention_dp", "with_attention_dp"} \
                    or not all(v in choices for v in mb.values()):
                raise UserError(f"{where}: moe_backend: expected without_attention_dp / with_attention_dp, each one "
                                f"of engine {e['backend']}'s moe_backend values ({', '.join(choices) or 'none'})")
        for key in ("engine_options", "attention_dp_engine_options"):
            opts = e.get(key)
            if opts is None:
                continue
            from perfcast.engines import get_engine

            declared = get_engine(e["backend"]).options
            if not isinstance(opts, dict) or not all(k in declared and v in declared[k].choices for k, v in opts.items()):
                raise UserError(f"{where}: {key}: expected a mapping of engine {e['backend']}'s options to one "
                                f"of their values ({', '.join(f'{k}: {o.choices}' for k, o in declared.items()) or 'none'})")
    return tuple(entries)


#: a script's step budget from its row: ``max(at_least, ⌈(CONC + ISL + plus) / multiple⌉ · multiple)``
_BUDGET_KEYS = ("plus", "multiple", "at_least")


def _budget(value, concurrency: int, isl: int) -> int | None:
    """The ``max_num_tokens`` of a recipe for a row: a count, or the script's formula (DeepSeek-R1's
    TensorRT-LLM scripts: ``$(( ($CONC+$ISL+64+63)/64*64 ))``, at least 8192)."""
    if not isinstance(value, dict):
        return value
    m = value["multiple"]
    return max(value["at_least"], -(-(concurrency + isl + value["plus"]) // m) * m)


def recipe_of(model_path: str, backend: str, system: str, precision: str, isl: int, osl: int,
              tp: int, attention_dp: bool = False, concurrency: int = 0, moe_tp: int = 1) -> Recipe | None:
    """The settings of the campaign's script for this row, or None where none is transcribed.
    SGLang's recv interval is the first of the entry's rules whose ``tp`` and
    ``concurrency_below`` the row meets (the scripts choose it by TP and concurrency)."""
    for e in _entries():
        if _matches(e, model_path, backend, system, precision):
            bw = e.get("batch_wait")
            wait = None
            if bw is not None and (isl, osl) == (bw["isl"], bw["osl"]) and tp < bw["tp_below"]:
                wait = (int(bw["timeout_iters"]), float(bw["max_tokens_ratio"]))
            moe = (e.get("moe_backend") or {}).get("with_attention_dp" if attention_dp else "without_attention_dp")
            recv = next((int(x["value"]) for x in e.get("scheduler_recv_interval") or ()
                         if x.get("tp", tp) == tp and concurrency < x.get("concurrency_below", concurrency + 1)), None)
            given = dict(e.get("engine_options") or {})
            if attention_dp and moe_tp == 1:  # the all-to-all capable layouts
                given.update(e.get("attention_dp_engine_options") or {})
            options = ((("moe_backend", moe),) if moe else ()) + tuple(sorted(given.items()))
            graphs = e.get("cuda_graph_max")
            if graphs not in (None, "concurrency"):
                raise UserError(f"{RECIPES}: cuda_graph_max: expected 'concurrency' (the scripts capture up to "
                                f"their CONC), got {graphs!r}")
            ab = e.get("attention_dp_balance") if attention_dp else None
            return Recipe(e.get("kv_cache_dtype"), _budget(e.get("max_num_tokens"), concurrency, isl), wait,
                          e.get("memory_fraction"),
                          " ".join(e["source"].split()), options, recv, (concurrency or None) if graphs else None,
                          None if ab is None else (int(ab["batching_wait_iters"]), int(ab["timeout_iters"])),
                          e.get("max_prefill_tokens"))
    return None


#: how a case's note on its batch limit begins
BATCH_NOTE = "engine max batch"


def with_batch_limit(case: Case) -> Case:
    """``case`` with a note where its batch is not the engine's limit (``Case.batch_limits``). An
    aggregated row's batch (per rank, × its attention-DP ranks) is the engine's max batch
    (InferenceMAX launches ``--max-num-seqs $CONC``: the batch is the concurrency) — except where it
    is below the row's concurrency: a client keeping more requests in flight than the engine may
    run would be measuring a queue the row does not describe, so that batch is not taken as a
    limit (the engine's default limit serves the client's load)."""
    if case.batch_limits:
        return case
    ranks = f" × {case.layout.dp} ranks" if case.layout.dp > 1 else ""
    note = (f"{BATCH_NOTE}: batch_size {case.batch}{ranks} is below the concurrency {case.concurrency}; not taken "
            f"as the engine's limit (its default serves the client's load)")
    return replace(case, notes=case.notes + (note,))


def with_recipe(case: Case, precision: str) -> Case:
    """``case`` with the engine settings its campaign's script launched it with, where the recipes
    transcribe them: the KV-cache dtype (where the row states none), the step token budget (and
    SGLang's prefill-batch cap), the memory fraction and TensorRT-LLM's batch waiting, and a note naming the script."""
    r = recipe_of(case.model_path, case.backend, case.system, precision, case.isl, case.osl, case.layout.tp,
                  case.layout.attention_dp, case.concurrency or 0, case.layout.moe_tp)
    if r is None:
        return case
    from perfcast.engines import merged_options

    kv = case.kv_dtype or r.kv_cache_dtype
    wait = (f", batch_wait_timeout_iters {r.batch_wait[0]}, batch_wait_max_tokens_ratio {r.batch_wait[1]:g}"
            if r.batch_wait else "")
    frac = f", memory fraction {r.memory_fraction:g}" if r.memory_fraction else ""
    tokens = f"max num tokens {r.max_num_tokens}" if r.max_num_tokens else "max num tokens the engine's default"
    if r.max_prefill_tokens:
        tokens += f", max prefill tokens {r.max_prefill_tokens}"
    moe = "".join(f", {k} {v}" for k, v in r.engine_options)
    recv = f", scheduler recv interval {r.recv_interval}" if r.recv_interval else ""
    graphs = f", CUDA graphs up to {r.cuda_graph_max} sequences (the concurrency)" if r.cuda_graph_max else ""
    adp = (f", attention_dp_config enable_balance (batching_wait_iters {r.adp_balance[0]}, timeout_iters "
           f"{r.adp_balance[1]})" if r.adp_balance else "")
    note = (f"{RECIPE_NOTE}: KV cache {kv or 'the model dtype'}, {tokens}{wait}{frac}{moe}{recv}{graphs}{adp} "
            f"({r.source})")
    return replace(case, kv_dtype=kv, max_num_tokens=r.max_num_tokens, batch_wait=r.batch_wait,
                   memory_fraction=r.memory_fraction, recv_interval=r.recv_interval,
                   engine_options=merged_options(case.engine_options, r.engine_options),
                   cuda_graph_max=r.cuda_graph_max, adp_balance=r.adp_balance, max_prefill_tokens=r.max_prefill_tokens,
                   notes=case.notes + (note,))
