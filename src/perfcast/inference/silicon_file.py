"""The silicon sample as a file: the columns perfcast reads, the shipped copy of aiconfigurator-core's
``silicon_sample.csv`` (:func:`read`, :func:`manifest`) and the conversion that writes it
(:func:`convert`), with what it adds from the free-text ``silicon_data_source``: the concurrency, the
benchmark client (:func:`benchmark_of`), the collection (:func:`collection_of`), the container image
(:func:`image_of`) and the measurement date (:func:`measured_of`). The mapping of a
row to a perfcast step is :mod:`perfcast.inference.silicon`."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from perfcast.inputs import load_yaml
from perfcast.ir import UserError

if TYPE_CHECKING:  # pandas is imported where the rows are read: the serving layer needs none of it
    import pandas as pd

#: Columns the mapping reads (the shipped copy keeps exactly these and WORKER_COLUMNS, plus
#: :data:`ADDED`).
COLUMNS = ("id", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
           "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
           "moe_tp_size", "moe_ep_size", "decode_batch_size", "decode_tp_size", "decode_pp_size",
           "decode_attention_dp_size", "decode_moe_tp_size", "decode_moe_ep_size", "silicon_ttft_ms",
           "silicon_tpot_ms")

#: Columns the serving replay reads where the source has them: a disaggregated run's prefill
#: workers and both pools' worker counts.
WORKER_COLUMNS = ("prefill_batch_size", "prefill_num_workers", "prefill_tp_size", "prefill_pp_size",
                  "prefill_attention_dp_size", "prefill_moe_tp_size", "prefill_moe_ep_size", "decode_num_workers")
_CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")
_IMAGE = re.compile(r"(?:^|;)\s*image=([^;]+)")
_MEASURED = re.compile(r"measured=(\d{4}-\d{2}-\d{2})")
#: A database dump's last field: the bare image reference (``lmsysorg/sglang:v0.5.10.post1-cu130``).
_BARE_IMAGE = re.compile(r"^[\w.-]+(?:[/#][\w.-]+)+(?::[\w.@-]+)+$")
#: The InferenceX (InferenceMAX) cohort's sources: its dated result files and its database dumps.
_INFERENCEX = re.compile(r"^(source_file=\d{4}-\d{2}-\d{2}\.csv|db-dump/)")


def concurrency_of(source: str) -> str:
    """The concurrency a row's client ran, from ``silicon_data_source``'s ``silicon_concurrency=``;
    empty where the source states none."""
    m = _CONCURRENCY.search(source or "")
    return m.group(1) if m else ""


def benchmark_of(source: str) -> str:
    """Which benchmark client measured a row, from ``silicon_data_source``: ``inferencex`` — the
    InferenceX / InferenceMAX runs (dated result files, ``db-dump/`` workflow runs), whose client
    is vLLM's ``benchmark_serving.py`` with ``--random-range-ratio 0.8 --num-prompts CONC*10
    --max-concurrency CONC --request-rate inf --ignore-eos`` (InferenceMAX ``benchmarks/*.sh``;
    ai-dynamo/aisimulate ``scripts/e2e_accuracy`` replays that cohort with the same workload);
    ``gap-analysis`` — aiconfigurator's own collections, whose client the source does not state."""
    return "inferencex" if _INFERENCEX.match(source or "") else "gap-analysis"


def collection_of(source: str) -> str:
    """The collection a row came from, from ``silicon_data_source``: its result file
    (``2026-04-06.csv``), database dump (``db-dump/2026-04-27``) or gap-analysis file — a local
    path cut to what follows its ``data/`` folder (``h100_sxm/trtllm/1.0.0rc3/…csv``)."""
    first = (source or "").split(";")[0].strip().removeprefix("source_file=")
    return first.split("/data/", 1)[1] if "/data/" in first else first


def image_of(source: str) -> str:
    """The container image that ran a row, from ``silicon_data_source``: its ``image=`` field, or a
    database dump's last field where that is a bare image reference; ``#`` (a registry separator
    some sources write) read as ``/``. Empty where the source names none."""
    fields = (source or "").split(";")
    m = _IMAGE.search(source or "")
    image = m.group(1).strip() if m else fields[-1].strip() if _BARE_IMAGE.match(fields[-1].strip()) else ""
    return image.replace("#", "/")


def measured_of(source: str) -> str:
    """The date (YYYY-MM-DD) a row was measured, from ``silicon_data_source``'s ``measured=``; empty
    where the source states none."""
    m = _MEASURED.search(source or "")
    return m.group(1) if m else ""


#: Columns the shipped copy adds, each derived from ``silicon_data_source`` by its function
#: (and derived again when a file without them is read).
ADDED = {"concurrency": concurrency_of, "benchmark": benchmark_of, "collection": collection_of,
         "image": image_of, "measured": measured_of}


def _int(row: dict, col: str, *, default: int | None = None, zero_is_unset: bool = False) -> int | None:
    """A row's integer column; ``default`` where it is empty (or 0, with ``zero_is_unset``); anything else
    is one line naming the row and the column."""
    text = str(row.get(col, "")).strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"row {row.get('id', '?')}: column {col}: {text!r} is not a number") from None
    if not value.is_integer() or value < 0:
        raise UserError(f"row {row.get('id', '?')}: column {col}: {text!r} is not a non-negative integer")
    return default if zero_is_unset and value == 0 else int(value)


def shipped_path() -> Path:
    return Path(str(resources.files("perfcast.data") / "validation" / "silicon_sample.csv"))


def _data(name: str) -> dict:
    return load_yaml(Path(str(resources.files("perfcast.data") / "validation" / name)))


def manifest() -> dict:
    return _data("MANIFEST.yaml")


def read(path: str | Path | None = None) -> tuple[pd.DataFrame, str]:
    """The rows (all values as strings, empty where the source is empty) and a one-line
    description of where they came from. ``path`` None: the copy shipped with perfcast."""
    import pandas as pd

    p = Path(path) if path is not None else shipped_path()
    try:
        frame = pd.read_csv(p, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"--silicon-sample {p}: no such file") from None
    except (OSError, pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise UserError(f"--silicon-sample {p}: not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{p}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                        f"(expected aiconfigurator-core's silicon_sample.csv layout)")
    source = frame.get("silicon_data_source", pd.Series([""] * len(frame)))
    for col, derive in ADDED.items():
        if col not in frame.columns:
            frame[col] = source.map(derive)
    for col in WORKER_COLUMNS:
        if col not in frame.columns:
            frame[col] = ""
    if path is None:
        m = manifest()
        where = (f"shipped copy of {m['source']['package']} {m['source']['package_version']} "
                 f"{m['source']['file']} ({len(frame):,} rows, {m['source']['licence']})")
    else:
        where = f"{p} ({len(frame):,} rows)"
    return frame, where


def convert(source: str | Path, out: str | Path) -> dict:
    """Write the shipped copy from aiconfigurator-core's file: :data:`COLUMNS` and
    :data:`WORKER_COLUMNS` verbatim (the source's own text, no float round trip) and :data:`ADDED`
    from ``silicon_data_source``: ``concurrency``, ``benchmark`` (:func:`benchmark_of`),
    ``collection`` (:func:`collection_of`), ``image`` (:func:`image_of`) and ``measured``
    (:func:`measured_of`). Returns the counts the MANIFEST records."""
    frame, _ = read(source)
    kept = frame[list(COLUMNS) + list(WORKER_COLUMNS) + list(ADDED)]
    kept.to_csv(out, index=False)
    return {"rows": len(kept), "sha256_source": hashlib.sha256(Path(source).read_bytes()).hexdigest(),
            "sha256": hashlib.sha256(Path(out).read_bytes()).hexdigest()}
