"""Fit the NVLink tier's per-collective calibration of the HGX H100/H200 topologies on measured
NCCL runs (H100 rows only; the H200 rows are held out for ``benchmarks/nccl_accuracy.py``); with
``--system b300_sxm`` of HGX B300 on the B300 rows, with ``--system gb200`` of the GB200 and GB300
NVL72 racks on the GB200 rows (the GB300 rows held out), in the same way.

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
tier of ``hgx-h100`` with a symbolic calibration of two protocols, ``ll`` and ``simple`` (NCCL's
LL/LL128 and Simple: one trades bandwidth for latency; NCCL picks per call), each with unknowns
``w = 1/bandwidth_efficiency``, ``latency_s = α`` per step and ``base_latency_s = α₀`` per call —
and each option must be linear in them, ``t = α₀ + s·α + c·w`` (the ring on a switch:
``s = k·(N−1)``, ``c = k·(N−1)/N·V/(L·B)``, ``k = 2`` for all-reduce). The model prices a row at
its cheapest option, so the fit minimises Σ (min over options of t_model / t_measured − 1)² over
all the op's rows, with w ≥ 1 (efficiency ≤ 1) and latencies ≥ 0: alternating least squares
(rows assigned to their cheapest option, then a bounded linear fit, until the assignment stops
changing) from several starts — the rows below each of a few sizes put on ``ll``, the rest on
``simple`` — each then polished on the min itself (``scipy.optimize.least_squares``); the best
start wins. A protocol's per-step and per-call latency that its chosen options cannot tell apart
(a one-step algorithm such as direct all-to-all) are fitted as one per-call latency, the per-step
one set to 0. Values are rounded to 3 significant digits (latencies first to the nanosecond, so
a bound the solver approaches, 1e-13 s, is written as 0); the protocol with the lower efficiency
is ``ll``, and a protocol that no row chooses after rounding is dropped and the rest refitted.
``--protocols one`` (any single name) fits one calibration, written without a ``protocols`` map.
The same values go into ``hgx-h200.yaml``: H200 keeps H100's NVLink4 links (18 × 25 GB/s per
direction) and third-generation NVSwitch chips.

The Blackwell systems (``--system``): ``b300_sxm`` — nccl-tests on one HGX B300 node, 2, 4 and 8
GPUs, into ``hgx-b300.yaml``; ``gb200`` — nccl-tests on one GB200 NVL72 compute tray, 2 and 4
GPUs, whose NVLink traffic goes through the rack's NVLink switch trays as any pair of the 72
does, into ``gb200-nvl72.yaml`` and unchanged into ``gb300-nvl72.yaml`` (GB300 keeps GB200's
fifth-generation NVLink, 18 × 50 GB/s per direction, and switch trays; the GB300 rows are held
out). The fit extrapolates from 4 GPUs to a rack of 72 through the model's ring forms (per-step
latency × N−1, bandwidth × (N−1)/N); no measurement of more than 4 NVL72 GPUs is public in
aiconfigurator-core 0.12.0.

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
from dataclasses import replace
from pathlib import Path

import numpy as np
import sympy
from scipy.optimize import least_squares, lsq_linear

from perfcast.hardware.topology import Calibration, Topology, load_topology_file
from perfcast.perf.collectives import span_costs, topology_cost

PIN = "aiconfigurator-core==0.12.0"
NCCL = "2.29.2"
TIER = "nvlink"
#: aiconfigurator op_name → perfcast collective
OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
       "alltoall": "all_to_all"}
ITEMSIZE = {"half": 2, "int8": 1}
TOPOLOGIES = Path(__file__).resolve().parent.parent / "src/perfcast/hardware/topologies"
#: system → (topology fitted on, topologies written, where the rows were measured, GPU counts,
#: label of the fitted device, held-out note per target written without rows of its own)
SYSTEMS = {
    "h100_sxm": ("hgx-h100", ("hgx-h100", "hgx-h200"), "one HGX H100 node", "2/4/8", "H100",
                 {"hgx-h200": "H100 fit applied unchanged: HGX H200 keeps H100's NVLink4 (18 links x 25 GB/s per "
                              "direction) and third-generation NVSwitch chips; H200 rows held out "
                              "(benchmarks/nccl_accuracy.py); "}),
    "b200_sxm": ("hgx-b200", ("hgx-b200",), "one HGX B200 node", "2/4/8", "B200", {}),
    "b300_sxm": ("hgx-b300", ("hgx-b300",), "one HGX B300 node", "2/4/8", "B300", {}),
    "gb200": ("gb200-nvl72", ("gb200-nvl72", "gb300-nvl72"),
              "one GB200 NVL72 compute tray, through the rack's NVLink switch trays", "2/4", "GB200",
              {"gb300-nvl72": "GB200 fit applied unchanged: GB300 NVL72 keeps GB200's fifth-generation NVLink "
                              "(18 links x 50 GB/s per direction) and NVLink switch trays; GB300 rows held out "
                              "(benchmarks/nccl_accuracy.py --device gb300); "}),
}


def rel(system: str) -> str:
    return f"systems/data/{system}/comm/nccl/{NCCL}/nccl_perf.parquet"
PROTOCOLS = ("ll", "simple")  # low-latency first
#: the fitted fields of a protocol, as written in the YAML; the efficiency enters as w = 1/efficiency
FIELDS = ("bandwidth_efficiency", "latency_s", "base_latency_s")
SCALE = {"bandwidth_efficiency": 1.0, "latency_s": 1e-6, "base_latency_s": 1e-6}  # O(1) unknowns
STARTS = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)  # ll below, simple from each size


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


def with_calibration(topo: Topology, op: str, cal: tuple[Calibration, ...]) -> Topology:
    tiers = tuple(replace(t, calibration=tuple((o, c) for o, c in t.calibration if o != op) + ((op, cal),))
                  if t.name == TIER else t for t in topo.tiers)
    return replace(topo, tiers=tiers)


def unknowns(protocols) -> list[tuple[str | None, str, sympy.Symbol]]:
    """(protocol, field, symbol) in the order of the coefficient vectors."""
    return [(p, f, sympy.Symbol(f"{p or 'one'}_{f}", positive=True)) for p in protocols for f in FIELDS]


def calibration(protocols, values: dict[tuple[str | None, str], object]) -> tuple[Calibration, ...]:
    return tuple(Calibration(values[p, "bandwidth_efficiency"], values[p, "latency_s"],
                             values[p, "base_latency_s"], p) for p in protocols)


def linear_forms(topo: Topology, op: str, rows, protocols) -> list[list[tuple[str, np.ndarray]]]:
    """Per row, every option perfcast offers as (algorithm, coefficients): its time is
    Σ coefficient × unknown, the unknowns being w = 1/efficiency and the latencies of each
    protocol."""
    syms = unknowns(protocols)
    sym = with_calibration(topo, op, calibration(protocols, {
        (p, f): 1 / s if f == "bandwidth_efficiency" else s for p, f, s in syms}))
    forms = []
    for n, nbytes, _ in rows:
        options = []
        for c in span_costs(op, nbytes, sym.span(n)):
            t = sympy.expand(c.time_s)
            coeffs = [t.coeff(s) for _, _, s in syms]
            if (sympy.expand(t - sum(k * s for k, (_, _, s) in zip(coeffs, syms))) != 0
                    or any(k.free_symbols for k in coeffs)):
                raise SystemExit(f"{op} {c.algorithm}: {c.formula} is not linear in the latencies and "
                                 f"1/efficiency; this fit assumes that form")
            options.append((c.algorithm, np.array([float(k) for k in coeffs])))
        forms.append(options)
    return forms


def _times(forms, x) -> np.ndarray:
    return np.array([min(float(k @ x) for _, k in f) for f in forms])


def _fit_assigned(forms, pick, t, lower, scale, free) -> np.ndarray:
    """Bounded linear least squares on relative error with every row on its picked option;
    unknowns outside ``free`` held at 0."""
    a = np.array([f[i][1] / ti for f, i, ti in zip(forms, pick, t)]) * scale
    x = np.zeros(len(scale))
    x[free] = lsq_linear(a[:, free], np.ones(len(t)), bounds=(lower[free], np.inf)).x
    return x * scale


def fit(forms, rows, protocols) -> tuple[dict[tuple[str | None, str], float], list[str]]:
    """Calibration values and the option chosen per row (see the module docstring); a value
    held at 0 because the chosen options cannot tell it apart is ``None``."""
    syms = unknowns(protocols)
    t = np.array([r[2] for r in rows])
    nbytes = np.array([r[1] for r in rows])
    scale = np.array([SCALE[f] for _, f, _ in syms])
    lower = np.array([1.0 if f == "bandwidth_efficiency" else 0.0 for _, f, _ in syms])
    best = None
    for start in STARTS if len(protocols) > 1 else (0,):
        want = [protocols[0] if b < start else protocols[-1] for b in nbytes]
        # first assignment: the datasheet-cheapest option of the wanted protocol
        guess = np.array([1.0 if f == "bandwidth_efficiency" else 2e-6 if f == "latency_s" else 0.0
                          for _, f, _ in syms])
        pick = [min((j for j, (a, _) in enumerate(f) if _protocol(a) in (w, None)),
                    key=lambda j: float(f[j][1] @ guess)) for f, w in zip(forms, want)]
        for _ in range(50):
            if len({_protocol(f[i][0]) for f, i in zip(forms, pick)}) < len(protocols):
                break  # a protocol lost every row: its figures are unconstrained; try another start
            free = _identifiable(forms, pick, syms)
            x = _fit_assigned(forms, pick, t, lower, scale, free)
            new = [_cheapest(f, x, syms) for f in forms]
            if new == pick:
                break
            pick = new
        if len({_protocol(f[i][0]) for f, i in zip(forms, pick)}) < len(protocols):
            continue
        # polish on the min itself (the assignment above ignores rows that switch option)
        sol = least_squares(lambda z: _times(forms, _expand(z, free, scale)) / t - 1, x[free] / scale[free],
                            bounds=(lower[free], np.inf), x_scale=1.0)
        x = _expand(sol.x, free, scale)
        loss = float(np.sum((_times(forms, x) / t - 1) ** 2))
        if best is None or loss < best[0]:
            best = (loss, x, free)
    if best is None:
        raise SystemExit(f"no start keeps rows on every protocol ({', '.join(protocols)}); fit fewer")
    _, x, free = best
    values = {(p, f): None if not fitted else 1 / v if f == "bandwidth_efficiency" else v
              for (p, f, _), v, fitted in zip(syms, x, free)}
    return values, [f[_cheapest(f, x, syms)][0] for f in forms]


def _cheapest(options, x, syms) -> int:
    """The option the model chooses at ``x``; of equal ones, the one with fewer latency steps
    (at α = 0 a ring and a one-step algorithm tie, and only the latter's latency is fitted)."""
    steps = np.array([f == "latency_s" for _, f, _ in syms])
    return min(range(len(options)), key=lambda j: (float(options[j][1] @ x), float(options[j][1] @ steps)))


def _expand(z, free, scale) -> np.ndarray:
    x = np.zeros(len(scale))
    x[free] = z
    return x * scale


def _protocol(algorithm: str) -> str | None:
    return algorithm.split("/")[1] if "/" in algorithm else None


def _identifiable(forms, pick, syms) -> np.ndarray:
    """The unknowns the picked options can tell apart (every protocol is picked by some row): a
    per-step latency collinear with the per-call one (a one-step algorithm) is held at 0."""
    a = np.array([f[i][1] for f, i in zip(forms, pick)])
    free = np.ones(len(syms), dtype=bool)
    for p in {p for p, _, _ in syms}:
        cols = [i for i, (q, _, _) in enumerate(syms) if q == p]
        used = np.abs(a[:, cols]).sum(axis=1) > 0
        if np.linalg.matrix_rank(a[used][:, cols]) < len(cols):
            step = next(i for i, (q, f, _) in enumerate(syms) if q == p and f == "latency_s")
            free[step] = False
    return free


def rounded(field: str, x: float) -> float:
    """3 significant digits; latencies first to the nanosecond (a bound reached only
    approximately, 1e-13 s, is 0)."""
    return float(f"{round(x, 9) if field != 'bandwidth_efficiency' else x:.3g}")


def errors(topo: Topology, op: str, rows) -> np.ndarray:
    return np.array([float(topology_cost(op, b, topo, n).time_s) / t - 1 for n, b, t in rows])


def describe(fit_of_op) -> str:
    """The fitted figures, as YAML flow mappings."""
    values, protocols = fit_of_op
    def one(p):
        return ", ".join(f"{f}: {_num(values[p, f])}" for f in FIELDS)
    return "; ".join(f"{p}: {{{one(p)}}}" if p else f"{{{one(p)}}}" for p in protocols)


def _num(v: float) -> str:
    return "0" if v == 0 else f"{v:.3g}".replace("e-0", "e-")


def source_text(op, rows, algos, formulas, err, version, target, links_bw: str, protocols, held,
                system: str = "h100_sxm") -> str:
    _, _, where, gpus, label, notes = SYSTEMS[system]
    held_out = notes.get(target, "")
    forms = "; ".join(f"{a}: {f}" for a, f in sorted({(a.split("/")[0], f) for a, f in zip(algos, formulas)}))
    share = ", ".join(f"{a} {algos.count(a)}" for a in sorted(set(algos)))
    per = (f"one option per protocol ({', '.join(protocols)}), the cheapest taken per row; "
           if protocols[0] is not None else "")
    note = (f"; α of {', '.join(p or 'the op' for p in held)} held at 0 (one step per call: not "
            f"separable from α₀)" if held else "")
    a = np.abs(err)
    return (f"{held_out}fitted by tools/calibrate_collectives.py on aiconfigurator-core {version} "
            f"{rel(system)} (Apache-2.0; NCCL {NCCL} nccl-tests on {where}, default algorithm "
            f"and protocol selection, out-of-place time): op_name {[k for k, v in OPS.items() if v == op][0]}, "
            f"{len(rows)} rows ({gpus} GPUs, half and int8, 512 B-512 MiB; V = message_size x dtype "
            f"size); least squares on relative error of the model's own forms ({per}{forms}; "
            f"L·B = {links_bw} times the efficiency, α the per-step and α₀ the per-call latency), "
            f"efficiency <= 1, latencies >= 0{note}; rows by option: {share}; {label} |error| median "
            f"{100 * np.median(a):.1f} %, p90 {100 * np.percentile(a, 90):.1f} %")


def render(fitted: dict, version: str, rowsets, target: str, links_bw: str,
           system: str = "h100_sxm") -> tuple[list[str], dict[str, str]]:
    block = ["    calibration:"]
    sources = {}
    for op, (values, protocols, algos, formulas, err, held) in fitted.items():
        def body(p):
            return ", ".join(f"{f}: {_num(values[p, f])}" for f in FIELDS)
        if protocols[0] is None:
            block.append(f"      {op}: {{{body(None)}}}")
        else:
            block += [f"      {op}:", "        protocols:"]
            block += [f"          {p}: {{{body(p)}}}" for p in protocols]
        sources[f"{TIER}.{op}"] = source_text(op, rowsets[op], algos, formulas, err, version, target,
                                              links_bw, protocols, held, system)
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


def fit_op(base: Topology, op: str, rows, protocols) -> tuple:
    """(values, protocols kept, chosen algorithm per row, their formulas, signed errors) of the
    rounded fit; a protocol no row chooses is dropped and the rest refitted."""
    values, _ = fit(linear_forms(base, op, rows, protocols), rows, protocols)
    held = [p for (p, f), v in values.items() if v is None]
    values = {(p, f): 0.0 if v is None else rounded(f, v) for (p, f), v in values.items()}
    if len(protocols) > 1:
        ordered = sorted(protocols, key=lambda p: values[p, "bandwidth_efficiency"])
        if list(ordered) != list(protocols):  # name by efficiency: the low-latency one is slower
            values = {(q, f): values[p, f] for p, q in zip(ordered, protocols) for f in FIELDS}
    cal = calibration(protocols, {k: sympy.Rational(repr(v)) for k, v in values.items()})
    topo = with_calibration(base, op, cal)
    chosen = [topology_cost(op, b, topo, n) for n, b, _ in rows]
    used = {_protocol(c.algorithm) for c in chosen}
    if len(protocols) > 1 and len(used) < len(protocols):
        kept = tuple(p for p in protocols if p in used)
        print(f"  {op}: protocol {', '.join(p for p in protocols if p not in used)} chosen by no row; "
              f"refitting with {', '.join(kept)}")
        return fit_op(base, op, rows, kept if len(kept) > 1 else (None,))
    return (values, protocols, [c.algorithm for c in chosen], [c.formula for c in chosen],
            errors(topo, op, rows), held)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aic-root", type=Path,
                    help="the aiconfigurator_core package directory (default: the importable one)")
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), metavar="NAME",
                    help="protocol options to fit, low-latency first (default: ll simple; one name: "
                         "a single calibration)")
    ap.add_argument("--system", choices=sorted(SYSTEMS), default="h100_sxm",
                    help="the NCCL table fitted on (default h100_sxm: writes hgx-h100 and hgx-h200; b300_sxm: "
                         "hgx-b300; gb200: gb200-nvl72 and gb300-nvl72)")
    ap.add_argument("--write", action="store_true", help="rewrite the system's topology files")
    args = ap.parse_args()
    protocols = tuple(args.protocols) if len(args.protocols) > 1 else (None,)
    root = aic_root(args.aic_root)
    base_name, targets, _, _, label, _ = SYSTEMS[args.system]
    path = root / rel(args.system) if root is not None else None
    if path is None or not path.exists():
        where = f"{path} is missing" if path is not None else "aiconfigurator_core is not importable"
        print(f"calibrate_collectives: needs the {label} NCCL table of {PIN} ({where}).\n"
              f"  python3.11 -m venv /tmp/aic && /tmp/aic/bin/pip install {PIN}\n"
              f"  then pass --aic-root /tmp/aic/lib/python3.11/site-packages/aiconfigurator_core",
              file=sys.stderr)
        return 2
    version = package_version(root)
    rowsets = read_rows(path)
    base = load_topology_file(TOPOLOGIES / f"{base_name}.yaml")
    base = replace(base, tiers=tuple(replace(t, calibration=()) if t.name == TIER else t for t in base.tiers))
    tier = next(t for t in base.tiers if t.name == TIER)
    print(f"fit on {version} {rel(args.system)}: {TIER} tier of {base_name}, L = {tier.links_per_device} links x "
          f"B = {float(tier.link_bandwidth_bytes_per_s):.3g} B/s, datasheet α = {float(tier.link_latency_s):.3g} s")
    fitted = {}
    for op, rows in rowsets.items():
        if not rows:
            continue
        values, kept, algos, formulas, err, held = fit_op(base, op, rows, protocols)
        fitted[op] = (values, kept, algos, formulas, err, held)
        raw = np.abs(errors(base, op, rows))
        a = np.abs(err)
        share = ", ".join(f"{x} {algos.count(x)}" for x in sorted(set(algos)))
        print(f"  {op:15s} {len(rows):4d} rows  {label} |error| median {100 * np.median(a):5.1f} %, "
              f"p90 {100 * np.percentile(a, 90):5.1f} %, max {100 * a.max():5.1f} % "
              f"(datasheet median {100 * np.median(raw):.1f} %); chosen: {share}")
        print(f"  {'':15s} {describe((values, kept))}")
    for target in targets:
        links_bw = f"{tier.links_per_device} x {float(tier.link_bandwidth_bytes_per_s):.3g} B/s"
        block, sources = render(fitted, version, rowsets, target, links_bw, args.system)
        file = TOPOLOGIES / f"{target}.yaml"
        if not args.write:
            print(f"\n# {file.name}: in tier {TIER}\n" + "\n".join(block) + "\n# calibration_sources:")
            for k, v in sources.items():
                print(f"  {k}: {yaml_quote(v)}")
            continue
        rewrite(file, block, sources)
        load_topology_file.cache_clear()
        loaded = load_topology_file(file)
        for op, (*_, err, _) in fitted.items():
            if not np.allclose(errors(loaded, op, rowsets[op]), err, rtol=1e-12, atol=0):
                raise SystemExit(f"{file}: the loaded calibration of {op} does not reproduce the fit")
        print(f"wrote {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
