"""The collector: time the distinct kernels a lowered model needs and write a profiling database.

Why: the empirical performance model prices a leaf by looking its features up in measured
tables (:mod:`perfcast.perf.profiling`). This module produces such tables for the local torch
device, at exactly the shapes the captured model needs, so a prediction can be checked against
the same model run for real (``benchmarks/validate_cpu_local.py``, ``benchmarks/gpu_closed_loop.py``).

Distinct leaves are keyed by (kernel type, key features); each is run through its representative
torch kernel (:mod:`perfcast.profiler.kernels`) after warm-up, and ``repeats`` samples are taken
through a timing backend (:mod:`perfcast.profiler.timing`); the median is recorded, with
``std_us``, ``p10_us``, ``p90_us``, ``samples``, ``rounds``, ``how`` and ``timing`` as extra CSV
columns (a noisy round is measured again: the machine may be shared). Writing merges with a
database already in the directory (new rows replace old ones with the same key).

On a CUDA GPU:

- **Back-to-back samples.** A sample is one event pair around ``calls`` consecutive calls, with
  ``calls`` chosen so that a sample lasts at least ``sample_s`` (200 µs): a kernel of a few
  microseconds is then timed as an eager step runs it — launch after launch, its time the
  larger of the kernel and the host's launch interval — not as one launch from an idle GPU
  (the event pair and the first launch's latency would dominate it).
- **L2.** Consecutive kernels of a real step read different weights, which come from HBM. A
  kernel timed over and over on one weight would find it in L2 (50 MB on an H100 SXM, by
  NVIDIA's H100 datasheet) and run faster than in the step. So the weight-like operands —
  GEMM weights, attention K/V, expert weights — cycle through distinct copies totalling at
  least ``rotate_bytes`` (default twice the GPU's L2), as aiconfigurator's collector cycles
  distinct weight copies
  (ai-dynamo/aiconfigurator ``collector/trtllm/collect_gemm.py``). Activations are not rotated:
  in a step they were just written by the previous kernel and are L2-hot. On a CPU nothing is
  rotated (the default ``rotate_bytes`` is 0): ``cpu-local`` was measured and validated that
  way (``benchmarks/validate_cpu_local.py``).
- **Timing mode.** ``timing="events"`` (default) includes the host's launch gaps, as an eager
  step does; ``timing="graph"`` captures the ``calls`` calls into a CUDA graph and times its
  replays — device time only, as aiconfigurator measures (CUDA-graph replay of repeated ops,
  ``collector/helper.py``, ``benchmark_with_power``). A kernel that cannot be captured falls back
  to events, and its ``timing`` column says why.
"""

from __future__ import annotations

import datetime
import math
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.inputs import dump_yaml, load_yaml
from perfcast.ir import Graph, Leaf, Loop, UserError
from perfcast.perf.features import features

#: kernel type → (key columns, interpolation axes) for the compute kinds.
COMPUTE = {
    "matmul": ("MatMul", ["M", "K", "N", "dtype"], ["M", "N", "K"]),
    "attention": ("Attention", ["batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype"], []),
    "grouped_matmul": ("GroupedMatMul", ["tokens", "hidden", "inter", "experts", "top_k", "dtype"], []),
}
ELEMENTWISE_KEYS = ["shape", "dtype"]
STATS = ["latency_us", "std_us", "p10_us", "p90_us", "samples", "rounds", "how", "timing"]
TIMINGS = ("events", "graph")


@dataclass
class Options:
    repeats: int = 10
    warmup: int = 3
    min_time_s: float = 0.02  # keep sampling small kernels until this much time has passed
    max_samples: int = 200
    noisy: float = 1.3  # a round whose p90 exceeds this × its p10 is measured again
    rounds: int = 3
    timing: str = "events"  # or "graph" (CUDA only): see the module docstring
    rotate_bytes: int | None = None  # weight copies cycled per kernel; None: 2 × L2 on CUDA, 0 on CPU
    sample_s: float = 2e-4  # a CUDA sample spans at least this long (calls per sample ≤ max_calls)
    max_calls: int = 1000


@dataclass
class Measured:
    """Rows per kernel type plus the op-name → kernel-type mapping, ready to write."""
    kernels: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    rows: dict[str, dict[tuple, dict]] = field(default_factory=dict)
    ops: dict[str, dict] = field(default_factory=dict)


def leaves(graph: Graph):
    for op in graph.ops:
        if isinstance(op, Leaf):
            yield op
        elif isinstance(op, Loop):
            yield from leaves(op.body)
        else:
            yield from leaves(op)


def table_name(op: str) -> str:
    """``fused[add+mul]`` → ``Elementwise_fused_add_mul``: a kernel and file name for an op."""
    return "Elementwise_" + re.sub(r"[^A-Za-z0-9]+", "_", op).strip("_")


def kernel_for(leaf: Leaf) -> tuple[str, str, list[str], list[str], str]:
    """(op name, kernel type, key columns, axes, mapping category) of a leaf."""
    op = str(leaf.attr("op") or leaf.kind).removeprefix("torch.ops.")
    if leaf.kind in COMPUTE:
        name, keys, axes = COMPUTE[leaf.kind]
        return op, name, keys, axes, "compute"
    return op, table_name(op), ELEMENTWISE_KEYS, [], "elementwise"


def distinct(graph: Graph) -> dict[tuple[str, tuple], tuple[Leaf, str, list[str], list[str], str]]:
    """(kernel type, key) → (a leaf with that key, op, keys, axes, category)."""
    found = {}
    for leaf in leaves(graph):
        op, kernel, keys, axes, category = kernel_for(leaf)
        feats = features(leaf)
        found.setdefault((kernel, tuple(feats[k] for k in keys)), (leaf, op, keys, axes, category))
    return found


def calls_per_sample(fn, backend, opts: Options) -> int:
    """1 on a CPU; on a GPU enough back-to-back calls for a sample of ``opts.sample_s``."""
    if backend.kind != "cuda":
        return 1
    one = statistics.median(backend.time(fn, warmup=opts.warmup, repeats=5))
    return max(1, min(opts.max_calls, math.ceil(opts.sample_s / max(one, 1e-9) - 1e-9)))  # 1e-9: float noise


def measure(fn, backend, opts: Options) -> dict:
    """Median, spread and sample count of ``fn`` in µs on the backend's device, and how it was
    timed. A noisy round (p90 over ``opts.noisy`` × p10: another process took the device) is
    retried, up to ``opts.rounds`` rounds, and the round with the lowest median is kept."""
    from perfcast.profiler.timing import GraphUnavailable

    calls = calls_per_sample(fn, backend, opts)
    # events: ``calls`` calls per sample, timed per call; graph: one replay of ``calls`` calls
    timed, per, scale = fn, calls, 1e6
    timing = (f"events, {calls} back-to-back call(s) per sample" if backend.kind == "cuda"
              else "time.perf_counter per call")
    if opts.timing == "graph":
        try:
            timed, per, scale = backend.capture(fn, calls=calls, warmup=opts.warmup), 1, 1e6 / calls
            timing = f"graph replay of {calls} call(s) per sample"
        except GraphUnavailable as e:
            timing = f"events, {calls} call(s) per sample (no graph: {e})"
    best = None
    for rnd in range(1, opts.rounds + 1):
        samples = [t * scale for t in backend.time(timed, warmup=opts.warmup, repeats=opts.repeats,
                                                   min_time_s=opts.min_time_s, max_samples=opts.max_samples,
                                                   calls=per)]
        q = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
        got = {"latency_us": statistics.median(samples), "std_us": statistics.pstdev(samples),
               "p10_us": q[0], "p90_us": q[-1], "samples": len(samples), "rounds": rnd}
        if best is None or got["latency_us"] < best["latency_us"]:
            best = got
        if q[-1] <= opts.noisy * q[0]:
            break
        time.sleep(0.05)
    best["rounds"] = rnd
    best["timing"] = timing
    return best


def rotate_bytes(backend, opts: Options) -> int:
    if opts.rotate_bytes is not None:
        return opts.rotate_bytes
    return 2 * backend.l2_bytes if backend.kind == "cuda" else 0


def collect(graph: Graph, device=None, opts: Options | None = None, into: Measured | None = None,
            progress=None) -> Measured:
    """Time every distinct kernel of ``graph`` on the torch ``device`` (CUDA when present);
    ``progress(done, total, line)`` after each kernel, ``line`` saying what it measured."""
    import torch

    from perfcast.profiler.kernels import build
    from perfcast.profiler.timing import backend as make_backend

    opts = opts or Options()
    bk = make_backend(device or ("cuda" if torch.cuda.is_available() else "cpu"), flag="--torch-device")
    rotate = rotate_bytes(bk, opts)
    out = into or Measured()
    torch.manual_seed(0)
    todo = distinct(graph)
    for i, ((kernel, key), (leaf, op, keys, axes, category)) in enumerate(todo.items()):
        out.kernels[kernel] = (keys, axes)
        out.ops[op] = {"category": category, "kernel_type": kernel}
        fn, how = build(leaf, bk.device, rotate_bytes=rotate)
        stats = measure(fn, bk, opts)
        del fn  # free its tensors (and weight copies) before the next kernel's
        out.rows.setdefault(kernel, {})[key] = {**stats, "how": how}
        if progress:
            progress(i + 1, len(todo), f"[{i + 1}/{len(todo)}] {kernel} {dict(zip(keys, key))}: "
                                       f"{stats['latency_us']:.1f} µs ({how}; {stats['timing']})")
    return out


def manifest(device_name: str, device, opts: Options, runs: list[dict]) -> dict:
    import numpy
    import torch

    from perfcast.profiler.timing import backend as make_backend

    bk = make_backend(str(device or ("cuda" if torch.cuda.is_available() else "cpu")), flag="--torch-device")
    cuda = bk.kind == "cuda"
    rotate = rotate_bytes(bk, opts)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device_name": device_name,
        "torch_device": bk.name if cuda else f"cpu ({platform.processor() or platform.machine()})",
        **({"cuda": bk.describe()} if cuda else {}),
        "platform": platform.platform(), "python": platform.python_version(),
        "torch": str(torch.__version__), "numpy": numpy.__version__,
        "transformers": _version("transformers"), "perfcast": _version("perfcast"),
        "threads": torch.get_num_threads(), "warmup": opts.warmup, "repeats": opts.repeats,
        "min_time_s": opts.min_time_s,
        "cpu_allocations": "allocator default: a timing loop reuses freed buffers (outputs are not "
                           "page-faulted, unlike many in an eager forward)",
        "noisy_retry": f"a round with p90 > {opts.noisy} x p10 is retried (at most {opts.rounds} "
                       f"rounds, lowest median kept)",
        "timing": (f"torch.cuda.Event pair around back-to-back calls, samples of at least "
                   f"{opts.sample_s * 1e6:.0f} us" + ("; replays of a CUDA graph of those calls" if opts.timing == "graph"
                                                       else "; host launch gaps included (eager)"))
        if cuda else "time.perf_counter per call",
        "l2": (f"weights, K/V and expert weights cycle through copies of at least {rotate} bytes in all "
               f"(2 x L2 = {2 * bk.l2_bytes} bytes by default); activations are not rotated" if rotate
               else "no rotation: operands are reused call after call"),
        "statistic": "latency_us = median of the samples; std_us, p10_us, p90_us = their spread",
        "profiled": runs,
    }


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "unknown"


def _existing(path: Path) -> dict:
    """What an earlier run wrote to ``path`` (nothing if it is not there), to merge into."""
    data = load_yaml(path) if path.exists() else None
    if data is not None and not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping at the top level (perfcast merges new measurements into it)")
    return data or {}


def database_dir(out: str | Path, device_name: str) -> Path:
    import torch

    return Path(out) / device_name / "torch" / str(torch.__version__)


def write(measured: Measured, out: str | Path, device_name: str, info: dict) -> Path:
    """Write (merging with what is there) ``{out}/{device}/torch/{version}/``: op_mapping.yaml,
    one CSV per kernel type and MANIFEST.yaml. Returns that directory."""
    import pandas as pd
    import torch

    root = database_dir(out, device_name)
    root.mkdir(parents=True, exist_ok=True)
    mapping_path = root / "op_mapping.yaml"
    old = _existing(mapping_path)
    kernels = dict(old.get("kernels") or {})
    ops = dict(old.get("ops") or {})
    for name, (keys, axes) in measured.kernels.items():
        kernels[name] = {"file": f"{name}.csv", "keys": keys, "axes": axes}
        path = root / f"{name}.csv"
        new = pd.DataFrame([{**dict(zip(keys, k)), **v} for k, v in measured.rows[name].items()],
                           columns=[*keys, *STATS])
        if path.exists():
            prev = pd.read_csv(path, dtype={"shape": str, "dtype": str})
            new = pd.concat([prev, new]).astype({c: str for c in ("shape", "dtype") if c in keys})
            new = new.drop_duplicates(subset=keys, keep="last")
        new.to_csv(path, index=False, float_format="%.4f")
    ops.update(measured.ops)
    mapping = {"schema": 1, "device": device_name, "framework": "torch", "version": str(torch.__version__),
               "kernels": kernels, "ops": ops}
    mapping_path.write_text(dump_yaml(mapping, sort_keys=False, width=200))
    man_path = root / "MANIFEST.yaml"
    runs = _existing(man_path).get("profiled") or []
    info = dict(info)
    info["profiled"] = runs + info.get("profiled", [])
    man_path.write_text(dump_yaml(info, sort_keys=False, width=200))
    return root
