"""Published serving measurements (``perfcast/data/validation/published.yaml``) as rows of the
silicon-sample layout, so one mapping (:func:`perfcast.inference.silicon.map_row`) prices both.

A table gives the deployment once (``row``) and one line per measurement (``columns``,
``values``); ``batch_size`` defaults to the concurrency (a closed-loop benchmark keeps that many
requests in flight). Every row keeps its source (URL, title, date, table).

Static-batch tables (``mode: static``) state an output throughput per GPU instead of a TPOT:
``output_tokens_per_s_per_gpu`` becomes the static batch's time per output token,
``batch / (throughput × GPUs)`` (throughput = batch · osl / latency), in ``silicon_tpot_ms``.
``dtype`` and ``kv_cache_dtype`` state the model and KV-cache precision where a source gives them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd

from perfcast.inference.silicon import COLUMNS
from perfcast.inputs import load_yaml
from perfcast.ir import UserError

#: Columns a published table may state beyond the silicon layout.
EXTRA = ("concurrency", "output_tokens_per_s_per_gpu", "dtype", "kv_cache_dtype")


def _per_token_ms(row: dict, where: str) -> str:
    """The static batch's time per output token from its throughput per GPU."""
    try:
        thr, batch = float(row.pop("output_tokens_per_s_per_gpu")), int(row["batch_size"])
        gpus = int(row["tp_size"] or 1) * int(row["pp_size"] or 1)
    except (KeyError, ValueError):
        raise UserError(f"{where}: output_tokens_per_s_per_gpu needs numeric batch_size and tp_size") from None
    if thr <= 0:
        raise UserError(f"{where}: output_tokens_per_s_per_gpu must be positive (got {thr:g})")
    return repr(batch / (thr * gpus) * 1e3)


def shipped_path() -> Path:
    return Path(str(resources.files("perfcast.data") / "validation" / "published.yaml"))


def read(path: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """(rows as strings in the silicon layout plus ``source``, the sources by key)."""
    p = Path(path) if path is not None else shipped_path()
    try:
        doc = load_yaml(p)
    except UserError as e:
        raise UserError(f"--published {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tables"), list):
        raise UserError(f"{p}: key 'tables': missing (expected a list of tables)")
    sources = doc.get("sources") or {}
    rows = []
    for i, t in enumerate(doc["tables"]):
        where = f"{p}: tables[{i}]"
        for key in ("source", "table", "row", "columns", "values"):
            if key not in t:
                raise UserError(f"{where}: key {key!r}: missing")
        if t["source"] not in sources:
            raise UserError(f"{where}: key 'source': {t['source']!r} is not one of sources ({', '.join(sources)})")
        unknown = [c for c in (*t["row"], *t["columns"]) if c not in COLUMNS and c not in EXTRA]
        if unknown:
            raise UserError(f"{where}: unknown column {unknown[0]!r} (expected silicon_sample.csv columns)")
        for j, values in enumerate(t["values"]):
            if len(values) != len(t["columns"]):
                raise UserError(f"{where}: values[{j}]: {len(values)} values for {len(t['columns'])} columns")
            row = {c: "" for c in COLUMNS}
            row.update({k: str(v) for k, v in t["row"].items()})
            row.update({c: str(v) for c, v in zip(t["columns"], values)})
            row.setdefault("concurrency", "")
            if not row["batch_size"]:
                row["batch_size"] = row["concurrency"]
            if "output_tokens_per_s_per_gpu" in row:
                row["silicon_tpot_ms"] = _per_token_ms(row, f"{where}: values[{j}]")
            label = (f"c{row['concurrency']}" if row["concurrency"] else
                     f"b{row['batch_size']} tp{row['tp_size']} {row['isl']}/{row['osl']}")
            row["id"] = f"{t['source']}: {t['table']}: {label}"
            row["source"] = t["source"]
            rows.append(row)
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "concurrency", "dtype", "kv_cache_dtype", "source"],
                         dtype=str).fillna("")
    return frame, sources
