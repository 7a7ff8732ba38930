"""The engine settings a measured campaign launched its runs with (``data/validation/
inferencex_recipes.yaml``): the KV-cache dtype, the step token budget and TensorRT-LLM's batch
waiting of the InferenceX scripts, applied to that campaign's rows of ``silicon_sample.csv``
in place of the engine's defaults. Transcribed launch flags, each with its script and commit;
nothing fitted."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from perfcast.inputs import checked_number
from perfcast.inputs.yamlfile import load_yaml
from perfcast.ir import UserError

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


@lru_cache(maxsize=None)
def _entries() -> tuple[dict, ...]:
    from importlib import resources

    doc = load_yaml(str(resources.files("perfcast.data") / "validation" / RECIPES))
    entries = doc.get("recipes") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{RECIPES}: expected a 'recipes' list")
    for k, e in enumerate(entries):
        where = f"{RECIPES}: recipes[{k}]"
        for key in ("model_path", "backend", "systems", "precisions", "source"):
            if not e.get(key):
                raise UserError(f"{where}: missing {key}")
        if e.get("kv_cache_dtype") not in (None, "bf16", "fp16", "fp8"):
            raise UserError(f"{where}: kv_cache_dtype {e['kv_cache_dtype']!r} (expected bf16, fp16 or fp8)")
        if e.get("max_num_tokens") is not None:
            checked_number(e["max_num_tokens"], f"{where}: max_num_tokens", integer=True, positive=True)
        if e.get("memory_fraction") is not None:
            checked_number(e["memory_fraction"], f"{where}: memory_fraction", positive=True, maximum=1)
        bw = e.get("batch_wait")
        if bw is not None:
            for key in ("isl", "osl", "tp_below", "timeout_iters"):
                checked_number(bw.get(key), f"{where}: batch_wait.{key}", integer=True, minimum=0)
            checked_number(bw.get("max_tokens_ratio"), f"{where}: batch_wait.max_tokens_ratio", minimum=0, maximum=1)
    return tuple(entries)


def recipe_of(model_path: str, backend: str, system: str, precision: str, isl: int, osl: int,
              tp: int) -> Recipe | None:
    """The settings of the campaign's script for this row, or None where none is transcribed."""
    for e in _entries():
        if (e["model_path"], e["backend"]) == (model_path, backend) and system in e["systems"] \
                and precision in e["precisions"]:
            bw = e.get("batch_wait")
            wait = None
            if bw is not None and (isl, osl) == (bw["isl"], bw["osl"]) and tp < bw["tp_below"]:
                wait = (int(bw["timeout_iters"]), float(bw["max_tokens_ratio"]))
            return Recipe(e.get("kv_cache_dtype"), e.get("max_num_tokens"), wait, e.get("memory_fraction"),
                          " ".join(e["source"].split()))
    return None
