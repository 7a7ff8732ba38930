"""The disaggregated deployments a measured InferenceX row ran, from the campaign's multi-node
configs: whether it ran speculative decoding (MTP) and, where the row does not say, how many
prefill and decode workers it had and how each was laid out.

InferenceX launches its disaggregated runs from ``.github/configs/nvidia-master.yaml``
(SemiAnalysisAI/InferenceX): per ``multinode: true`` config key and input / output length,
search-space entries of a concurrency list, a prefill and a decode worker pool (``num-worker``,
``tp`` — GPUs per worker —, ``ep``, ``dp-attn``) and ``spec-decoding``. ``tools/inferencex_multinode.py``
transcribes every entry of that file's history with the days it was in force
(``data/validation/inferencex_multinode.csv``). A row's entries are those of its system (the
campaign's runners), backend (its Dynamo framework), model, precision, lengths, concurrency,
container image and measurement day (in force that day or the day before: ``RUN_DAYS``), and whose worker pools have the row's GPUs per worker (and
worker counts, where the row states them). The decode workers' engine settings come from the srt-slurm
recipe an entry runs, or, for GB200 TensorRT-LLM entries without one, from the Dynamo performance sweep its
launch script runs (the ``launcher`` column). Transcribed config keys; nothing fitted.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from datetime import date, timedelta
from functools import lru_cache
from importlib import resources

from perfcast.inference.recipes import campaign_model
from perfcast.inference.silicon_file import _int
from perfcast.ir import UserError

TABLE = "inferencex_multinode.csv"
#: silicon system → the campaign's runner names of its multi-node runs (InferenceX .github/configs/runners.yaml)
RUNNERS = {"b200_sxm": ("b200-multinode", "b200-multinode-slurm"), "b300_sxm": ("b300",), "gb200": ("gb200",),
           "gb300": ("gb300",), "h100_sxm": ("h100-multinode", "h100-multinode-slurm"),
           "h200_sxm": ("h200-multinode", "h200-multinode-slurm")}
#: backend → the campaign's disaggregated framework (NVIDIA Dynamo in front of the engine)
FRAMEWORKS = {"trtllm": "dynamo-trt", "sglang": "dynamo-sglang", "vllm": "dynamo-vllm"}
#: a config key's model prefix (its ``model-prefix``) → the model path of silicon rows
MODELS = {"dsr1": "deepseek-ai/DeepSeek-R1", "kimik2.5": "moonshotai/Kimi-K2.5", "gptoss": "openai/gpt-oss-120b"}
#: a row measured on day D may have run from the config of the day before (a multi-node sweep's result
#: is stamped when it ends): entries in force on D or on the RUN_DAYS days before are its candidates.
#: Windows of 1 to 30 days classify the shipped rows alike; 0 days would take 44 rows measured the day
#: after their configuration's switch to MTP for MTP runs alone.
RUN_DAYS = 1
#: a row no entry in force can have measured takes the entries merged within this many days after its day
#: (:func:`merged_later`): Kimi-K2.5's GB200 TensorRT-LLM runs of 2026-04-02, merged 16 days later
#: (InferenceX #1026); DeepSeek-R1's H200 ones of 2026-02-14, 11 days later, the same container image
MERGED_DAYS = 30
#: how the approximate label of a row priced with a configuration merged after it begins
MERGED_NOTE = "configuration merged after the run"
#: how the approximate label of a row both an MTP and a plain entry may have measured begins
EITHER_NOTE = "speculative or plain"
#: how the note of a row whose workers the config gives begins
WORKERS_NOTE = "workers from the campaign's config"


@dataclass(frozen=True)
class Pool:
    workers: int
    tp: int  # GPUs per worker
    ep: int
    dp_attn: bool

    def __str__(self) -> str:
        return f"{self.workers} × (tp {self.tp}, ep {self.ep}{', attention DP' if self.dp_attn else ''})"


@dataclass(frozen=True)
class Entry:
    key: str
    runner: str
    framework: str
    model_path: str
    precision: str
    image: str
    isl: int
    osl: int
    mtp: bool
    concurrencies: frozenset[int]
    prefill: Pool
    decode: Pool
    config_file: str
    first: str
    first_commit: str
    until: str
    recipe_commit: str = ""
    recipe_concurrencies: frozenset[int] = frozenset()
    kv_cache_dtype: str = ""  # the decode workers' (srt-slurm recipe: trtllm_config / sglang_config decode)
    moe_backend: str = ""
    moe_a2a: str = ""  # the decode workers' MoE all-to-all backend (SGLang --moe-a2a-backend; "" unstated)
    max_batch: int | None = None    # the decode workers' batch limit per rank (TensorRT-LLM max_batch_size)
    cuda_graph: int | None = None   # their largest decode CUDA graph (0: none)
    launcher: str = ""  # where the settings come from when no srt-slurm recipe gives them (Dynamo's sweeps)

    def source(self) -> str:
        return f"{self.key}{', ' + self.config_file if self.config_file else ''}, from {self.first_commit} ({self.first})"

    def settings_source(self) -> str:
        """Where the decode workers' settings were read: the srt-slurm recipe, or the launch path."""
        return self.launcher or f"{self.config_file} at NVIDIA/srt-slurm {self.recipe_commit}"


def _count(text: str) -> int | None:
    return int(text) if text != "" else None


def _pool(r: dict, pre: str) -> Pool:
    return Pool(int(r[f"{pre}workers"]), int(r[f"{pre}tp"]), int(r[f"{pre}ep"]), r[f"{pre}dp_attn"] == "True")


def read(path) -> tuple[Entry, ...]:
    """The entries of a table written by ``tools/inferencex_multinode.py``, of the models silicon rows have."""
    out = []
    with open(path, newline="") as f:
        for k, r in enumerate(csv.DictReader(f), start=2):
            model = MODELS.get(str(r.get("config_key") or "").split("-")[0])
            if model is None:
                continue  # a model no silicon row has
            try:
                out.append(Entry(r["config_key"], r["runner"], r["framework"], model, r["precision"], r["image"],
                                 int(r["isl"]), int(r["osl"]), r["spec_decoding"] == "mtp",
                                 frozenset(int(c) for c in r["concurrencies"].split()), _pool(r, "prefill_"),
                                 _pool(r, "decode_"), r["config_file"], r["first"], r["first_commit"], r["until"],
                                 r["recipe_commit"], frozenset(int(c) for c in r["recipe_concurrencies"].split()),
                                 r["decode_kv_cache_dtype"], r["decode_moe_backend"], r["decode_moe_a2a"],
                                 _count(r["decode_max_batch_size"]), _count(r["decode_cuda_graph_max"]),
                                 r["launcher"]))
            except (KeyError, ValueError, TypeError, AttributeError) as e:
                raise UserError(f"{path}: line {k}: {type(e).__name__} {e} (expected the columns "
                                f"tools/inferencex_multinode.py writes)") from None
    return tuple(out)


@lru_cache(maxsize=None)
def entries() -> tuple[Entry, ...]:
    return read(str(resources.files("perfcast.data") / "validation" / TABLE))


def _gpus(row: dict, pre: str) -> int | None:
    tp = _int(row, f"{pre}tp_size")
    return tp * (_int(row, f"{pre}attention_dp_size") or 1) if tp else None


def candidates(row: dict) -> tuple[Entry, ...]:
    """The entries that can have measured a disaggregated InferenceX row (the module's doc); where none
    was in force, those the campaign merged within ``MERGED_DAYS`` after the row's day (:func:`merged_later`)."""
    return _matching(row, in_force=True) or merged_later(row)


def merged_later(row: dict) -> tuple[Entry, ...]:
    """The entries first in force within ``MERGED_DAYS`` after a row's day, of the first such day, that
    would have measured it: a result from before its configuration reached the campaign's main branch is
    its pull request's run (InferenceX runs a pull request's sweep before merging it), and the configuration
    as merged is the nearest evidence of the one that ran — labelled approximate (``MERGED_NOTE``)."""
    day = row.get("measured") or ""
    if not day:
        return ()
    last = (date.fromisoformat(day) + timedelta(days=MERGED_DAYS)).isoformat()
    later = [e for e in _matching(row, in_force=False) if day < e.first <= last]
    first = min((e.first for e in later), default=None)
    return tuple(e for e in later if e.first == first)


def _matching(row: dict, *, in_force: bool) -> tuple[Entry, ...]:
    day, image, c = row.get("measured") or "", row.get("image") or "", _int(row, "concurrency")
    since = (date.fromisoformat(day) - timedelta(days=RUN_DAYS)).isoformat() if day else ""
    found = []
    for e in entries():
        if (e.runner not in RUNNERS.get(row.get("system"), ()) or e.framework != FRAMEWORKS.get(row.get("backend"))
                or e.model_path != campaign_model(row.get("model_path", "")) or e.precision != row.get("precision")
                or (e.isl, e.osl) != (_int(row, "isl"), _int(row, "osl"))
                or c not in e.concurrencies | e.recipe_concurrencies
                or (image and e.image != image)
                or (in_force and day and not (e.first <= day and (not e.until or e.until >= since)))):
            continue
        if any(_gpus(row, pre) not in (None, pool.tp) or _int(row, f"{pre}num_workers") not in (None, pool.workers)
               for pre, pool in (("prefill_", e.prefill), ("decode_", e.decode))):
            continue
        found.append(e)
    return tuple(found)


def _columns(pre: str, pool: Pool) -> dict[str, str]:
    """A worker pool as the silicon file's columns (tp · attention_dp = moe_tp · moe_ep)."""
    ranks = pool.tp if pool.dp_attn else 1
    return {f"{pre}num_workers": str(pool.workers), f"{pre}tp_size": str(pool.tp // ranks),
            f"{pre}attention_dp_size": str(ranks), f"{pre}moe_tp_size": str(max(1, pool.tp // pool.ep)),
            f"{pre}moe_ep_size": str(pool.ep)}


@dataclass(frozen=True)
class Resolution:
    """What the campaign's multi-node configs say of a row (:func:`resolve`)."""

    row: dict
    reason: str | None = None  # why it is not priced
    either: str | None = None  # what is approximate about it
    note: str | None = None  # the workers the config gives
    recipe: Entry | None = None  # the one plain entry's srt-slurm recipe settings, where all agree
    limits: Entry | None = None  # a plain entry whose decode batch limit and CUDA graphs all the plain ones share
    merged: str | None = None  # approximate: the entries were merged after the row was measured


def _agreed(entries: list[Entry], settings) -> Entry | None:
    """The first of ``entries`` where all state the same ``settings(entry)`` and the recipe states
    any of them ("" or None: the recipe leaves it to the engine, or the entry names no recipe)."""
    values = {settings(e) for e in entries}
    return entries[0] if len(values) == 1 and any(v not in ("", None) for v in next(iter(values))) else None


def resolve(row: dict) -> Resolution:
    """The row, with the worker pools the campaign's config gives where the row states no worker
    counts (the decode pool alone where the entries agree on it and not on the prefill pool), for a
    disaggregated InferenceX row. Not priced where every entry that can have measured
    it ran MTP (its TPOT depends on an acceptance rate neither the row nor the campaign states);
    labelled approximate where MTP and plain entries both can have (priced as the plain one), and where
    the entries were merged after the row's day (:func:`merged_later`)."""
    if row.get("mode") != "disagg" or row.get("benchmark") != "inferencex":
        return Resolution(row)
    found = candidates(row)
    if not found:
        return Resolution(row)
    measured = row.get("measured") or ""
    merged = (f"{MERGED_NOTE}: no entry of the campaign's multi-node configs that can have measured this row was in "
              f"force on {measured}; the configuration merged on {found[0].first} stands in ({found[0].source()}; "
              f"{TABLE}), the run presumably its pull request's") if measured and found[0].first > measured else None
    c, day = row.get("concurrency"), row.get("measured") or "an unstated day"
    mtp = [e for e in found if e.mtp]
    if len(mtp) == len(found):
        return Resolution(row, (f"ran speculative decoding, MTP in every entry of the campaign's multi-node configs "
                                f"that can have measured it (concurrency {c}, {day}: "
                                f"{'; '.join(e.source() for e in mtp[:3])}; {TABLE}); the row states no acceptance "
                                f"rate, on which its TPOT depends" + (f" ({merged})" if merged else "")))
    plain = [e for e in found if not e.mtp]
    either = (f"{EITHER_NOTE}: the campaign's multi-node configs ran this deployment at concurrency {c} both with MTP "
              f"({mtp[0].source()}) and without ({plain[0].source()}; {TABLE}); priced as the plain one") if mtp else None
    recipe = _agreed(plain, lambda e: (e.kv_cache_dtype, e.moe_backend, e.moe_a2a))
    limits = _agreed(plain, lambda e: (e.max_batch, e.cuda_graph))
    decodes, prefills = {e.decode for e in plain}, sorted({e.prefill for e in plain}, key=str)
    if _int(row, "decode_num_workers") or len(decodes) != 1:
        return Resolution(row, None, either, None, recipe, limits, merged)
    (decode,) = decodes
    batch = ("the decode batch is the concurrency over the decode workers' attention-DP ranks, as the campaign's "
             "database dump states it")
    if len(prefills) == 1:
        note = f"{WORKERS_NOTE}: prefill {prefills[0]}, decode {decode} ({plain[0].source()}; {TABLE}); {batch}"
        return Resolution({**row, **_columns("prefill_", prefills[0]), **_columns("decode_", decode)}, None, either,
                          note, recipe, limits, merged)
    # the entries agree on the decode pool, which sets the decode step, and differ in the prefill pool: the
    # decode pool is taken, the prefill pool stays as the row states it (its worker count unknown)
    note = (f"{WORKERS_NOTE}: decode {decode} ({'; '.join(e.source() for e in plain[:2])}; {TABLE}); {batch}; "
            f"the entries differ in their prefill pools ({', '.join(map(str, prefills))}), so the row's own prefill "
            f"columns stay")
    return Resolution({**row, **_columns("decode_", decode)}, None, either, note, recipe, limits, merged)


#: how a case's note naming its recipe's (or its launcher's) settings begins
RECIPE_NOTE = "engine settings of the campaign's multi-node recipe"


def with_recipe(case, entry: Entry | None):
    """``case`` with its decode workers' KV-cache dtype (where the row states none), MoE backend and MoE
    all-to-all backend (engine options, where the engine's profile has them) as the srt-slurm recipe of its config entry
    launched them (or, for an entry without one, the Dynamo performance sweep its launch script runs: the
    ``launcher`` column); a backend the engine's profile does not price keeps its default, and the note says so."""
    if entry is None:
        return case
    from perfcast.engines import get_engine, merged_options

    kv = case.kv_dtype or entry.kv_cache_dtype or None
    options, said = case.engine_options, []
    option = get_engine(case.engine).options.get("moe_backend") if entry.moe_backend else None
    if option is not None and entry.moe_backend in option.choices \
            and case.device in (option.devices or {}).get(entry.moe_backend, [case.device]):
        options = merged_options(options, {"moe_backend": entry.moe_backend})
        said.append(f"MoE backend {entry.moe_backend}")
    elif entry.moe_backend:
        said.append(f"MoE backend {entry.moe_backend}, which perfcast's {case.engine} profile does not price "
                    f"(its default kept)")
    a2a = get_engine(case.engine).options.get("moe_a2a_backend") if entry.moe_a2a else None
    if a2a is not None and entry.moe_a2a == a2a.value:
        said.append(f"MoE all-to-all {entry.moe_a2a} (the engine's default)")
    elif a2a is not None and entry.moe_a2a in a2a.choices:
        options = merged_options(options, {"moe_a2a_backend": entry.moe_a2a})
        said.append(f"MoE all-to-all {entry.moe_a2a}")
    elif entry.moe_a2a:
        said.append(f"MoE all-to-all {entry.moe_a2a}, which perfcast's {case.engine} profile does not price "
                    f"(its default kept)")
    if entry.kv_cache_dtype:
        said.insert(0, f"KV cache {entry.kv_cache_dtype}")
    note = f"{RECIPE_NOTE}: decode workers' {', '.join(said)} ({entry.settings_source()}; {TABLE})"
    return replace(case, kv_dtype=kv, engine_options=options, notes=case.notes + (note,))


#: how a case's note naming its recipe's (or its launcher's) decode limits begins
LIMITS_NOTE = "decode limits of the campaign's multi-node recipe"


def with_limits(case, entry: Entry | None):
    """``case`` with its decode workers' batch limit per rank (the engine never runs more: a row's
    concurrency over the ranks beyond it waits in the queue) and their largest CUDA graph, as the
    srt-slurm recipe of its config entry launched them (TensorRT-LLM ``max_batch_size`` and
    ``cuda_graph_config``, SGLang ``--cuda-graph-max-bs``)."""
    if entry is None or case.mode != "disagg":
        return case
    said, batch = [], case.batch
    if entry.max_batch is not None:
        batch = min(case.batch, entry.max_batch)
        said.append(f"batch limit {entry.max_batch} per rank" + (f" (the row's {case.batch} capped)"
                                                                  if batch < case.batch else ""))
    if entry.cuda_graph is not None:
        said.append(f"CUDA graphs up to {entry.cuda_graph} sequences" if entry.cuda_graph else "no CUDA graphs")
    note = f"{LIMITS_NOTE}: {', '.join(said)} ({entry.settings_source()}; {TABLE})"
    return replace(case, batch=batch, cuda_graph_max=entry.cuda_graph, notes=case.notes + (note,))
