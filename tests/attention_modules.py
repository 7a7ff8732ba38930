"""What the attention-module benchmarks' tests share (benchmarks/dsa_module_accuracy.py,
benchmarks/mla_module_accuracy.py): the benchmark loaded as a namespace, and one layer's module
from text-generate's concrete step, the leaves the benchmark keeps."""

from __future__ import annotations

import runpy
from pathlib import Path

import perfcast
from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.models import load_model_config

ROOT = Path(perfcast.__file__).parents[2]


def benchmark(name: str) -> dict:
    """The namespace of ``benchmarks/<name>.py``."""
    return runpy.run_path(str(ROOT / "benchmarks" / f"{name}.py"))


def concrete_module_s(model, device, engine, tp, decode, batch, tokens, past, *, quantize=None,
                      stubbed=frozenset()) -> float:
    """One MoE layer's ``self_attn`` from text-generate's concrete step: every leaf but the all-reduce and
    the ``stubbed`` kernels (what a collector does not run), each at its time and launch latency."""
    kw = dict(num_queries=batch, context_length=past, decode=True) if decode else \
        dict(num_queries=batch, query_length=tokens, context_length=past)
    r = simulate(Request(load_model_config(model), get_device(device), engine=engine, layout=Layout(tp=tp),
                         quantize=quantize, **kw))
    return sum(float((lt.time_s + lt.trips * lt.launch_s) / lt.trips) for lt in r.rollups["analytic"].leaves
               if str(lt.leaf.attr("module") or "").startswith("model.layers.3.self_attn")
               and lt.leaf.kind != "all_reduce" and lt.leaf.attr("kernel") not in stubbed)


def shipped_sample(bench: dict, key: str):
    """The benchmark's shipped sample, checked against its MANIFEST entry ``key`` (sha256 and row count)."""
    import hashlib

    from perfcast.inference import silicon_file

    m = silicon_file.manifest()[key]
    path = ROOT / "src/perfcast/data/validation" / m["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m["sha256"]
    rows = bench["shipped"]()
    assert len(rows) == m["rows"]
    return rows


def no_rows_is_one_line(bench: dict, capsys) -> None:
    """``--device`` of a device the shipped sample has no rows of: exit 2 and one line on stderr."""
    assert bench["main"](["--device", "mi300x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--device mi300x: no rows") and "\n" not in err
