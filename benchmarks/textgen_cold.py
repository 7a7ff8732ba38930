"""Benchmark: one cold ``perfcast text-generate`` run, as a new process.

Runs ``perfcast text-generate deepseek-v3 --device h200-sxm --decode --num-queries 64
--context-length 4096`` as a new process: with an empty capture cache (the model is captured),
with the cache the first run left (the symbolic capture is reused: no torch import), and with
``--no-reroll --no-cache`` (every one of the 61 decoder layers captured); and a bare
``python -c "import torch"`` — each ``--repeats`` times, in this run, a torch import alternating
with each empty-cache run so that both see the same machine — and prints median wall times, the
child processes' CPU time (user + system), and the ratios.

Target: the empty-cache run within 2× the bare torch import measured in the same run (wall). Beside
them, a new process that only imports what any capture of this model needs (``FLOOR``: torch,
torch._dynamo, SymPy, transformers' registry, ``modeling_utils`` and the model's file) — the part of
the empty-cache run no change to perfcast's own code removes; the rest is perfcast's (its imports and
argument parsing, the capture on fake tensors, pricing).

The perfcast runs use this checkout's ``src`` (``PYTHONPATH``), whatever is installed.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/textgen_cold.py``).
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = ["text-generate", "deepseek-v3", "--device", "h200-sxm", "--decode", "--num-queries", "64",
           "--context-length", "4096", "--json"]
TARGET_RATIO = 2.0  # empty-cache run / `python -c "import torch"`, wall, same run
#: what any capture of this model imports, whatever perfcast does around it: torch, torch._dynamo
#: (FakeTensorMode and ShapeEnv import it: torch/fx/experimental/symbolic_shapes.py imports
#: validator.py, which imports torch._dynamo; torch._compile._disable_dynamo imports it on the first
#: decomposed op), SymPy, transformers' model registry and modeling_utils (by perfcast's own faster
#: path, capture/hf_imports.py) and the model's modeling file — with the cyclic garbage collector off, as
#: perfcast imports them (capture/heap.py first_capture)
FLOOR = ("import gc; gc.disable(); import torch, sympy, torch._dynamo; "
         "from perfcast.capture import hf_imports; hf_imports.models(); hf_imports.modeling_utils(); "
         "import transformers.models.deepseek_v3.modeling_deepseek_v3")
SRC = Path(__file__).resolve().parent.parent / "src"


def run(argv: list[str], cache: str | None = None, fresh: bool = False) -> tuple[float, float]:
    """(wall s, CPU s) of one new process; ``cache`` is its XDG cache home, emptied first if ``fresh``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    if cache:
        env["XDG_CACHE_HOME"] = cache
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    perfcast = [sys.executable, "-m", "perfcast.cli.main"]
    # where PYTHONDONTWRITEBYTECODE is set, a new process would otherwise compile every module of
    # this checkout that changed since `make setup` byte-compiled it (an installed package is
    # byte-compiled when installed)
    compileall.compile_dir(str(SRC / "perfcast"), quiet=1)
    cache = tempfile.mkdtemp(prefix="perfcast-bench-cache-")
    torch_runs, floor_runs, empty_runs = [], [], []
    for _ in range(args.repeats):
        torch_runs.append(run([sys.executable, "-c", "import torch"]))
        floor_runs.append(run([sys.executable, "-c", FLOOR]))
        empty_runs.append(run(perfcast + COMMAND, cache, fresh=True))
    cached_runs = [run(perfcast + COMMAND, cache) for _ in range(args.repeats)]
    unrolled_runs = [run(perfcast + COMMAND + ["--no-reroll", "--no-cache"], cache) for _ in range(args.repeats)]
    shutil.rmtree(cache, ignore_errors=True)
    (torch_s, torch_cpu) = median(torch_runs)
    print(f"perfcast {' '.join(COMMAND[:-1])}  (median of {args.repeats} new processes; {SRC})")
    print(f"  {'':44s} {'wall':>6s}{'':19s}{'CPU':>6s}")
    rows = [("baseline: python -c 'import torch'", torch_runs),
            ("the imports any capture needs (FLOOR)", floor_runs),
            ("empty capture cache (captures the model)", empty_runs),
            ("capture cache from an earlier run", cached_runs),
            ("--no-reroll --no-cache (61 layers captured)", unrolled_runs)]
    for label, samples in rows:
        wall, cpu = median(samples)
        print(f"  {label:44s} {wall:6.2f} s = {wall / torch_s:5.2f}× torch  {cpu:6.2f} s = {cpu / torch_cpu:5.2f}× torch")
    floor_s, empty_s = median(floor_runs)[0], median(empty_runs)[0]
    ratio = empty_s / torch_s
    print(f"  perfcast's own part of the empty-cache run (empty − FLOOR): {empty_s - floor_s:.2f} s; "
          f"the target leaves it {TARGET_RATIO * torch_s - floor_s:.2f} s")
    print(f"  target: empty capture cache ≤ {TARGET_RATIO:g}× import torch (wall, this run): "
          f"{ratio:.2f}× — {'met' if ratio <= TARGET_RATIO else 'NOT met'}")


if __name__ == "__main__":
    main()
