"""Published serving measurements (``perfcast/data/validation/published.yaml``) as rows of the
silicon-sample layout, so one mapping (:func:`perfcast.inference.silicon.map_row`) prices both.

A table gives the deployment once (``row``) and one line per measurement (``columns``,
``values``); ``batch_size`` defaults to the concurrency (a closed-loop benchmark keeps that many
requests in flight). Every row keeps its source (URL, title, date, table).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd
import yaml

from perfcast.inference.silicon import COLUMNS
from perfcast.ir import UserError


def shipped_path() -> Path:
    return Path(str(resources.files("perfcast.data") / "validation" / "published.yaml"))


def read(path: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """(rows as strings in the silicon layout plus ``source``, the sources by key)."""
    p = Path(path) if path is not None else shipped_path()
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise UserError(f"--published {p}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise UserError(f"--published {p}: not valid YAML ({str(e).splitlines()[0]})") from None
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
        unknown = [c for c in (*t["row"], *t["columns"]) if c not in COLUMNS and c != "concurrency"]
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
            row["id"] = f"{t['source']}: {t['table']}: c{row['concurrency']}"
            row["source"] = t["source"]
            rows.append(row)
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "concurrency", "source"], dtype=str)
    return frame, sources
