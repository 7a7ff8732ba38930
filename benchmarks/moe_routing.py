"""Benchmark: does a MoE fit calibrated on balanced routing price other routings from their work?

perfcast's MoE kernel fits are calibrated on the measured tables' ``balanced`` rows, where every
expert a token can reach is reached (``min(E/ep, T·k/ep)`` experts' weights read), and price a
served step at the work of the routing it assumes (random by default: ``E/ep·(1 − (1 − k/E)^T)``
experts, :mod:`perfcast.ir.routing`). That is sound only if the fitted curve carries over from
one routing's work to another's. The tables hold the same kernels measured under two skewed
routings (aiconfigurator-core 0.12.0's ``power_law_1.01`` and ``power_law_1.2`` rows, never used
in a fit): this prices each of them from the balanced fit (1) at the balanced rows' work, as if
routing did not matter, and (2) at the work of its own routing — the token-expert pairs and the
experts with tokens on the measured device, their expectation over draws of the collector's
routing as its source describes it (``collector/helper.py::_generate_power_law_distribution``,
re-implemented here, not imported: per-expert loads drawn from a power law on [1, 0.8·T]
(on [0.01, 2] when T·k ≤ E), scaled to T·k and rounded, capped at T, the shortfall or excess
moved one token at a time to the least- (most-) loaded expert of each EP rank in turn, and the
most-loaded rank measured). Out of sample by construction: no power-law row is in any fit.

    python benchmarks/moe_routing.py [--device h200-sxm ...] [--framework trtllm ...] [--draws 64]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from perfcast.db.calibrate import Sample, fit_sample, frame, peaks, samples  # noqa: E402
from perfcast.db.calibrate import TABLE_CLASSES  # noqa: E402
from perfcast.hardware import get_device  # noqa: E402
from perfcast.perf.kernel_classes import CLASSES  # noqa: E402
from perfcast.perf.profiling import find_database, load_database  # noqa: E402

DEVICES = ("h100-sxm", "h200-sxm", "b200-sxm")
FRAMEWORKS = ("trtllm", "vllm", "sglang")


def power_law_loads(tokens: int, experts: int, top_k: int, ep: int, alpha: float, rng) -> np.ndarray:
    """One draw of the collector's per-expert token counts, the most-loaded EP rank first."""
    lo, hi = (1.0, tokens * 0.8) if tokens * top_k > experts else (0.01, 2.0)
    u = rng.random(experts)
    x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    total = tokens * top_k
    counts = np.minimum(np.round(x / x.sum() * total).astype(np.int64), tokens)
    per_rank = counts.reshape(ep, experts // ep)
    delta = int(total - counts.sum())
    step = 1 if delta > 0 else -1
    rank = 0
    while delta != 0:
        row = per_rank[rank % ep]
        ok = row < tokens if step > 0 else row > 0
        if ok.any():
            idx = np.flatnonzero(ok)
            pick = idx[np.argmin(row[idx])] if step > 0 else idx[np.argmax(row[idx])]
            row[pick] += step
            delta -= step
        rank += 1
    return per_rank[np.argmax(per_rank.sum(axis=1))]


def expected_rank0(tokens, experts, top_k, ep, alpha, draws, seed=0) -> tuple[float, float]:
    """(token-expert pairs, experts with tokens) on the measured rank, averaged over draws."""
    rng = np.random.default_rng(seed)
    loads = [power_law_loads(tokens, experts, top_k, ep, alpha, rng) for _ in range(draws)]
    return float(np.mean([x.sum() for x in loads])), float(np.mean([(x > 0).sum() for x in loads]))


def skewed(root, cls_name: str, variant: str):
    """The power-law rows of the table(s) a class's balanced fit was made on, per routing."""
    import pandas as pd

    db = load_database(root)
    cls = CLASSES[cls_name]
    parts = [frame(db.tables[name]) for name in sorted(db.mapping.kernels) if TABLE_CLASSES.get(name) == cls_name]
    df = pd.concat(parts, ignore_index=True) if parts else None
    if df is None or "routing" not in df.columns:
        return {}
    df = df[df["routing"].str.startswith("power_law")]
    variants = np.array([cls.variant(dict(r)) for r in df[list(cls.keys)].to_dict("records")])
    df = df[variants == variant]
    return {r: part for r, part in df.groupby("routing")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="append", choices=DEVICES)
    ap.add_argument("--framework", action="append", choices=FRAMEWORKS)
    ap.add_argument("--draws", type=int, default=64)
    args = ap.parse_args(argv)
    print(f"{'device':9s} {'engine':7s} {'variant':18s} {'routing':15s} {'rows':>6s}   "
          f"{'balanced work':>22s}   {'its own work':>22s}")
    pooled = {"balanced": [], "own": []}
    for device_name in args.device or DEVICES:
        device = get_device(device_name)
        for fw in args.framework or FRAMEWORKS:
            try:
                root = find_database(device_name, framework=fw)
            except Exception:  # noqa: BLE001 — a device without this engine's tables
                continue
            for sample in samples(root):
                if not sample.cls.name.startswith("moe"):
                    continue
                fit = fit_sample(sample, device)
                if fit is None:
                    continue
                pk = peaks(device, sample.cls, sample.variant)
                for routing, df in skewed(root, sample.cls.name, sample.variant).items():
                    alpha = float(routing.rsplit("_", 1)[1])
                    shapes = {k: (str(df[k].iloc[0]) if k == "dtype" else df[k].to_numpy(dtype=float))
                              for k in sample.cls.keys}
                    flat = Sample(sample.cls, sample.variant, shapes, df["latency_us"].to_numpy() * 1e-6, "")
                    key = np.stack([shapes[k] for k in ("tokens", "experts", "top_k", "moe_ep")], axis=1).astype(int)
                    memo = {}
                    for row in map(tuple, np.unique(key, axis=0)):
                        memo[row] = expected_rank0(*row, alpha, args.draws)
                    own = np.array([memo[tuple(r)] for r in key])
                    units = device.spec.datasheet.compute_units
                    t_bal = fit.time(flat.cls.work(flat.shapes, units), *pk)
                    t_own = fit.time(flat.cls.work({**flat.shapes, "pairs": own[:, 0], "active": own[:, 1]}, units), *pk)
                    e_bal, e_own = t_bal / flat.latency_s - 1, t_own / flat.latency_s - 1
                    pooled["balanced"].append(e_bal)
                    pooled["own"].append(e_own)
                    print(f"{device_name:9s} {fw:7s} {sample.variant:18s} {routing:15s} {len(df):6d}   "
                          f"{_cell(e_bal):>22s}   {_cell(e_own):>22s}", flush=True)
    for name, errs in pooled.items():
        e = np.concatenate(errs) if errs else np.array([np.nan])
        print(f"all power-law rows, priced at {'the balanced rows' if name == 'balanced' else 'their own'} work: "
              f"{_cell(e)} over {len(e)} rows")
    return 0


def _cell(e: np.ndarray) -> str:
    return f"{np.median(np.abs(e)) * 100:5.1f} % ({np.median(e) * 100:+6.1f} %)"


if __name__ == "__main__":
    sys.exit(main())
