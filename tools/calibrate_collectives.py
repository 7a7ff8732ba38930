"""Fit the NVLink tier's per-collective calibration of the HGX H100/H200 topologies on measured
NCCL runs (H100 rows only; the H200 rows are held out for ``benchmarks/nccl_accuracy.py``).

Data source (data only, no code reused): ``aiconfigurator-core==0.12.0`` (NVIDIA, Apache-2.0),
``aiconfigurator_core/systems/data/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet``: nccl-tests
(``all_gather_perf`` …, one process with one thread per GPU, NCCL 2.29.2 with its default
algorithm and protocol selection — the table has no NVLS or forced-algorithm rows, every row is
``kernel_source`` NCCL) on one HGX H100 node, 2, 4 and 8 GPUs, ``half`` and ``int8``, 21 sizes
from 512 B to 512 MiB. ``latency`` is the out-of-place time in **milliseconds**;
``message_size`` is an **element count**: message_size × dtype size is nccl-tests' ``size``,
the larger of a rank's input and output buffers (the gathered output of an all-gather, the
scattered input of a reduce-scatter) — the same ``V`` as perfcast's collective leaves
(``perfcast.ir.rules.collective_message``) and ``perfcast.perf.collectives`` (and the ``bytes``
column of the shipped H200 database, converted by ``perfcast db import aiconfigurator``).

Method, per collective (all_reduce, all_gather, reduce_scatter, all_to_all): perfcast's own cost
forms are asked for every row — :func:`perfcast.perf.collectives.span_costs` on the ``nvlink``
tier of ``hgx-h100`` with a symbolic calibration (``bandwidth_efficiency = 1/w``,
``latency_s = α``) — and each option must be linear, ``t = s·α + c·w`` (the ring on a switch:
``s = k·(N−1)``, ``c = k·(N−1)/N·V/(L·B)``, ``k = 2`` for all-reduce); the model's choice (the
cheapest option) is taken at the current estimate, iterated until it no longer changes. The fit
minimises Σ (t_model / t_measured − 1)² over all the op's rows — linear least squares in
(α, w) with α ≥ 0 and w ≥ 1 (efficiency ≤ 1) — and rounds both to 3 significant digits. Every
field of :class:`~perfcast.hardware.topology.Calibration` is fitted the same way, so a latency
term added to the schema and the cost forms is fitted without changing this tool.
The same values go into ``hgx-h200.yaml``: H200 keeps H100's NVLink4 links (18 × 25 GB/s per
direction) and third-generation NVSwitch chips.

Usage::

    python3.11 -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator-core==0.12.0
    .venv/bin/python tools/calibrate_collectives.py \\
        --aic-root /tmp/aic/lib/python3.11/site-packages/aiconfigurator_core [--write]

Without ``--write`` it prints the fit and the YAML to paste; with it, it rewrites the ``nvlink``
tier's ``calibration`` and the matching ``calibration_sources`` of both files and checks that
the loaded topologies price every row as the fit did. Exits 2 when the data is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import sympy
from scipy.optimize import lsq_linear

from perfcast.hardware.topology import Calibration, Topology, load_topology_file
from perfcast.perf.collectives import span_costs, topology_cost

PIN = "aiconfigurator-core==0.12.0"
SYSTEM, NCCL = "h100_sxm", "2.29.2"
REL = f"systems/data/{SYSTEM}/comm/nccl/{NCCL}/nccl_perf.parquet"
TIER = "nvlink"
#: aiconfigurator op_name → perfcast collective
OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
       "alltoall": "all_to_all"}
ITEMSIZE = {"half": 2, "int8": 1}
TOPOLOGIES = Path(__file__).resolve().parent.parent / "src/perfcast/hardware/topologies"
TARGETS = ("hgx-h100", "hgx-h200")
#: every Calibration field is fitted; the efficiency enters as 1/w, the latencies as themselves
FIELDS = tuple(f.name for f in fields(Calibration))
SYMBOLS = {name: sympy.Symbol(name, positive=True) for name in FIELDS}
SCALE = {name: 1.0 if name == "bandwidth_efficiency" else 1e-6 for name in FIELDS}  # O(1) unknowns


def aic_root(given: Path | None) -> Path | None:
    if given is not None:
        return given
    spec = importlib.util.find_spec("aiconfigurator_core")
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def package_version(root: Path) -> str:
    for info in sorted(root.parent.glob("aiconfigurator_core-*.dist-info")):
        return info.name.removeprefix("aiconfigurator_core-").removesuffix(".dist-info")
    return "unknown"


def read_rows(path: Path) -> dict[str, list[tuple[int, int, float]]]:
    """op → [(GPUs, bytes, seconds)], sorted."""
    import pandas as pd

    df = pd.read_parquet(path)
    unknown = sorted(set(df.nccl_dtype) - set(ITEMSIZE))
    if unknown:
        raise SystemExit(f"{path}: unknown nccl_dtype {unknown}")
    out: dict[str, list[tuple[int, int, float]]] = {}
    for name, op in OPS.items():
        rows = df[df.op_name == name]
        out[op] = sorted((int(g), int(m) * ITEMSIZE[d], float(t) * 1e-3)
                         for g, m, d, t in zip(rows.num_gpus, rows.message_size, rows.nccl_dtype, rows.latency))
    return out


def with_calibration(topo: Topology, op: str, cal: Calibration) -> Topology:
    tiers = tuple(replace(t, calibration=tuple((o, c) for o, c in t.calibration if o != op) + ((op, cal),))
                  if t.name == TIER else t for t in topo.tiers)
    return replace(topo, tiers=tiers)


def linear_forms(topo: Topology, op: str, rows) -> list[list[tuple[str, np.ndarray]]]:
    """Per row, every option perfcast offers as (algorithm, coefficients): its time is
    Σ coefficient × unknown, the unknowns being 1/efficiency and the latencies."""
    cal = Calibration(**{n: 1 / s if n == "bandwidth_efficiency" else s for n, s in SYMBOLS.items()})
    sym = with_calibration(topo, op, cal)
    forms = []
    for n, nbytes, _ in rows:
        options = []
        for c in span_costs(op, nbytes, sym.span(n)):
            t = sympy.expand(c.time_s)
            coeffs = [t.coeff(s) for s in SYMBOLS.values()]
            if (sympy.simplify(t - sum(k * s for k, s in zip(coeffs, SYMBOLS.values()))) != 0
                    or any(k.free_symbols for k in coeffs)):
                raise SystemExit(f"{op} {c.algorithm}: {c.formula} is not linear in the latencies and "
                                 f"1/efficiency; this fit assumes that form")
            options.append((c.algorithm, np.array([float(k) for k in coeffs])))
        forms.append(options)
    return forms


def fit(forms, rows) -> tuple[dict[str, float], list[str]]:
    """Calibration values and the algorithm chosen per row: least squares on relative error,
    efficiency ≤ 1, latencies ≥ 0; the choice (the cheapest option) is re-made at each estimate
    until it no longer changes."""
    t = np.array([r[2] for r in rows])
    scale = np.array([SCALE[n] for n in FIELDS])
    lower = np.array([1.0 if n == "bandwidth_efficiency" else 0.0 for n in FIELDS])
    pick = [0] * len(rows)
    for _ in range(20):
        a = np.array([f[i][1] / ti for f, i, ti in zip(forms, pick, t)]) * scale
        x = lsq_linear(a, np.ones(len(rows)), bounds=(lower, np.inf)).x * scale
        new = [min(range(len(f)), key=lambda j: float(f[j][1] @ x)) for f in forms]
        if new == pick:
            break
        pick = new
    values = {n: 1 / v if n == "bandwidth_efficiency" else v for n, v in zip(FIELDS, x)}
    return values, [f[i][0] for f, i in zip(forms, pick)]


def sig3(x: float) -> float:
    return float(f"{x:.3g}")


def errors(topo: Topology, op: str, rows) -> np.ndarray:
    return np.array([float(topology_cost(op, b, topo, n).time_s) / t - 1 for n, b, t in rows])


def source_text(op, rows, algos, formulas, err, version, target, links_bw: str) -> str:
    held_out = ("" if target == "hgx-h100" else
                "H100 fit applied unchanged: HGX H200 keeps H100's NVLink4 (18 links x 25 GB/s per "
                "direction) and third-generation NVSwitch chips; H200 rows held out "
                "(benchmarks/nccl_accuracy.py); ")
    forms = "; ".join(f"{a}: {f}" for a, f in sorted(set(zip(algos, formulas))))
    a = np.abs(err)
    return (f"{held_out}fitted by tools/calibrate_collectives.py on aiconfigurator-core {version} "
            f"{REL} (Apache-2.0; NCCL {NCCL} nccl-tests on one HGX H100 node, default algorithm "
            f"selection, out-of-place time): op_name {[k for k, v in OPS.items() if v == op][0]}, "
            f"{len(rows)} rows (2/4/8 GPUs, half and int8, 512 B-512 MiB; V = message_size x dtype "
            f"size); least squares on relative error of the model's own form ({forms}; L·B = {links_bw} "
            f"times the efficiency, α the latency), efficiency <= 1; H100 |error| median "
            f"{100 * np.median(a):.1f} %, p90 {100 * np.percentile(a, 90):.1f} %")


def render(fitted: dict, version: str, rowsets, target: str, links_bw: str) -> tuple[list[str], dict[str, str]]:
    block = ["    calibration:"]
    sources = {}
    for op, (values, algos, formulas, err) in fitted.items():
        body = ", ".join(f"{n}: {v:.3g}".replace("e-0", "e-") for n, v in values.items())
        block.append(f"      {op}: {{{body}}}")
        sources[f"{TIER}.{op}"] = source_text(op, rowsets[op], algos, formulas, err, version, target, links_bw)
    return block, sources


def rewrite(path: Path, block: list[str], sources: dict[str, str]) -> None:
    """Replace the nvlink tier's calibration block and its calibration_sources entries; other
    lines are kept as they are."""
    lines = path.read_text().splitlines()
    out, i, in_tier = [], 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("  - name: "):
            if in_tier:
                out.extend(block)
            in_tier = line == f"  - name: {TIER}"
        elif in_tier and not line.startswith("    "):
            out.extend(block)
            in_tier = False
        if in_tier and line == "    calibration:":
            i += 1
            while i < len(lines) and lines[i].startswith("      "):
                i += 1
            continue
        if line == "calibration_sources:":
            i += 1
            while i < len(lines) and lines[i].startswith("  "):
                key = lines[i].strip().split(":", 1)[0]
                if key not in sources:
                    out.append(lines[i])
                i += 1
            continue
        out.append(line)
        i += 1
    if in_tier:
        out.extend(block)
    if "calibration_sources:" not in out:
        out.append("calibration_sources:")
    at = out.index("calibration_sources:") + 1
    while at < len(out) and out[at].startswith("  "):
        at += 1
    out[at:at] = [f"  {k}: {yaml_quote(v)}" for k, v in sources.items()]
    path.write_text("\n".join(out) + "\n")


def yaml_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aic-root", type=Path,
                    help="the aiconfigurator_core package directory (default: the importable one)")
    ap.add_argument("--write", action="store_true", help="rewrite hgx-h100.yaml and hgx-h200.yaml")
    args = ap.parse_args()
    root = aic_root(args.aic_root)
    path = root / REL if root is not None else None
    if path is None or not path.exists():
        where = f"{path} is missing" if path is not None else "aiconfigurator_core is not importable"
        print(f"calibrate_collectives: needs the H100 NCCL table of {PIN} ({where}).\n"
              f"  python3.11 -m venv /tmp/aic && /tmp/aic/bin/pip install {PIN}\n"
              f"  then pass --aic-root /tmp/aic/lib/python3.11/site-packages/aiconfigurator_core",
              file=sys.stderr)
        return 2
    version = package_version(root)
    rowsets = read_rows(path)
    base = load_topology_file(TOPOLOGIES / "hgx-h100.yaml")
    base = replace(base, tiers=tuple(replace(t, calibration=()) if t.name == TIER else t for t in base.tiers))
    tier = next(t for t in base.tiers if t.name == TIER)
    print(f"fit on {version} {REL}: {TIER} tier of hgx-h100, L = {tier.links_per_device} links x "
          f"B = {float(tier.link_bandwidth_bytes_per_s):.3g} B/s, datasheet α = {float(tier.link_latency_s):.3g} s")
    head = " ".join(f"{n:>20s}" for n in FIELDS)
    print(f"  {'op':15s} {'rows':>4s} {'algorithm':>11s} {head} {'median':>7s} {'p90':>7s} {'max':>7s}"
          f"   H100 |error| (datasheet median)")
    fitted = {}
    for op, rows in rowsets.items():
        if not rows:
            continue
        values, _ = fit(linear_forms(base, op, rows), rows)
        values = {n: sig3(v) for n, v in values.items()}
        zero = [n for n, v in values.items() if v <= 0]
        if zero:
            raise SystemExit(f"{op}: {zero[0]} fits to 0; the topology schema needs a positive value")
        topo = with_calibration(base, op, Calibration(**{n: sympy.Rational(repr(v)) for n, v in values.items()}))
        chosen = [topology_cost(op, b, topo, n) for n, b, _ in rows]
        algos, formulas = [c.algorithm for c in chosen], [c.formula for c in chosen]
        err, raw = errors(topo, op, rows), np.abs(errors(base, op, rows))
        fitted[op] = (values, algos, formulas, err)
        a = np.abs(err)
        cells = " ".join(f"{v:20.3g}" for v in values.values())
        print(f"  {op:15s} {len(rows):4d} {'/'.join(sorted(set(algos))):>11s} {cells} "
              f"{100 * np.median(a):6.1f}% {100 * np.percentile(a, 90):6.1f}% {100 * a.max():6.1f}%   "
              f"({100 * np.median(raw):.1f}%)")
    for target in TARGETS:
        links_bw = f"{tier.links_per_device} x {float(tier.link_bandwidth_bytes_per_s):.3g} B/s"
        block, sources = render(fitted, version, rowsets, target, links_bw)
        file = TOPOLOGIES / f"{target}.yaml"
        if not args.write:
            print(f"\n# {file.name}: in tier {TIER}\n" + "\n".join(block) + "\n# calibration_sources:")
            for k, v in sources.items():
                print(f"  {k}: {yaml_quote(v)}")
            continue
        rewrite(file, block, sources)
        load_topology_file.cache_clear()
        loaded = load_topology_file(file)
        for op, (*_, err) in fitted.items():
            if not np.allclose(errors(loaded, op, rowsets[op]), err, rtol=1e-12, atol=0):
                raise SystemExit(f"{file}: the loaded calibration of {op} does not reproduce the fit")
        print(f"wrote {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
