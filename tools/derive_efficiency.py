"""Derive size-dependent efficiency tables (achieved / datasheet peak) for perfcast.

Data source (data only, no code reused): the measured per-kernel tables shipped in the
PyPI package ``aiconfigurator-core==0.12.0`` (Apache-2.0), under
``aiconfigurator_core/systems/data/<system>/<op>/<framework>/<version>/<table>.parquet``.
Every table has a ``latency`` column in **milliseconds** (checked physically: a
4353x65536x51200 bf16 GEMM on H100 takes 39.3 "units" = 74% of the 989 TFLOP/s peak
if the unit is ms; a 2.1 GB decode-attention KV read takes 0.71 units = 3.0 TB/s).

The curves are derived to be consistent with how perfcast prices a kernel:

    time = kernel_static_latency_s
           + max(flops / (peak_flops * e_matrix(flops)), bytes / (peak_bw * e_memory(bytes)))

so the fixed cost is subtracted before computing efficiency (not counted twice), and the
matrix curve uses only compute-bound shapes (HBM time is charged separately).

Per device, from the TensorRT-LLM tables (the newest version directory that holds the
table; vLLM/SGLang only as fallback):

* ``kernel_static_latency_s`` (= static) -- minimum measured latency of any bf16 GEMM in
  ``gemm/<fw>/<ver>/gemm_perf.parquet`` (tiny GEMMs are pure fixed cost; a lower bound).
* ``efficiency.matrix`` -- same table, bf16 rows, one latency per (m, n, k) (median if a
  shape is listed more than once). Kept: shapes above the ridge point, i.e. arithmetic
  intensity 2mnk / (2(mk+kn+mn)) FLOP/B > peak_flops / peak_bw, and with
  latency - static >= 0.5 us. Per shape e = 2mnk / ((latency - static) * peak_flops).
* ``efficiency.memory`` -- ``attention/<fw>/<ver>/generation_attention_perf.parquet``
  (decode attention: one new token per sequence reads the whole KV cache). Kept: bf16 KV
  cache, full attention (window_size 0), beam_width 1, MHA (num_heads ==
  num_key_value_heads; this is also the sanity filter that sidesteps the A100 GQA rows
  implying > 100% of HBM peak), latency - static >= 0.5 us. Bytes = 4*batch*(isl+step)*
  kv_heads*head_dim (K and V, bf16) + 4*batch*num_heads*head_dim (q and output);
  per row e = bytes / ((latency - static) * peak_bw).

Buckets: half-decade on size (bucket j holds round(2*log10(size)) == j, reported at
10**(j/2)); buckets with fewer than MIN_SHAPES shapes are dropped. Statistic: MEDIAN of
the per-shape e in the bucket (robust to bad-tile and wave-quantisation outliers).
Efficiencies are rounded to 3 decimals; a bucket median above 1 is clipped to 1.0 (and
the source text says which buckets); a median that rounds to 0 is dropped (reported).
Output is deterministic (sorted input, no randomness).
"""
import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.inference.silicon import tables
from perfcast.inputs import load_yaml

PKG = "aiconfigurator-core 0.12.0"
MIN_SHAPES = 5
MIN_NET_S = 0.5e-6  # drop rows with latency - static below this: efficiency is noise
# perfcast device -> aiconfigurator system dir, as the validation maps them (data/validation/mapping.yaml
# systems). The peaks (dense bf16 FLOP/s, HBM B/s) are read from perfcast's own device files, so an
# efficiency is always relative to the datasheet value that perfcast multiplies it with.
SYSTEMS = {v["device"]: s for s, v in tables()["systems"].items() if v.get("device")}
DEVICE_DIR = Path(__file__).resolve().parent.parent / "src/perfcast/hardware/devices"


def _peaks(device: str):
    sheet = load_yaml(DEVICE_DIR / f"{device}.yaml")["datasheet"]  # as perfcast reads it (YAML 1.2 numbers)
    return float(sheet["matrix_flops_per_s"]["bf16"]), float(sheet["hbm_bandwidth_bytes_per_s"])


DEVICES = {d: (sysname, *_peaks(d)) for d, sysname in SYSTEMS.items()}
FRAMEWORKS = ("trtllm", "vllm", "sglang")


def _vkey(v):
    return tuple(int(x) for x in re.findall(r"\d+", v))


def find_table(sysdir: Path, op: str, fname: str):
    """Newest version dir (preferring trtllm) that actually holds `fname`."""
    for fw in FRAMEWORKS:
        hits = sorted((sysdir / op / fw).glob(f"*/{fname}"), key=lambda p: _vkey(p.parent.name))
        if hits:
            return hits[-1]
    return None


def bucket_median(size, eff):
    """-> (points, clipped [(size, median)], dropped-as-zero sizes, rows used, rows with e > 1)."""
    df = pd.DataFrame({"j": np.rint(2 * np.log10(size)).astype(int), "e": eff})
    g = df.groupby("j")["e"].agg(["median", "count"])
    g = g[g["count"] >= MIN_SHAPES]
    pts, clipped, zero, used = [], [], [], 0
    for j, (m, c) in g.iterrows():
        x, e = 10 ** (j / 2), round(float(m), 3)
        if e <= 0.0:
            zero.append(x)
            continue
        if e > 1.0:
            clipped.append((x, float(m)))
            e = 1.0
        pts.append((x, e))
        used += int(c)
    over = int((df[df.j.isin(g.index)].e > 1).sum())
    return pts, clipped, zero, used, over


def static_latency(path: Path):
    df = pd.read_parquet(path)
    return df[df.gemm_dtype == "bfloat16"].latency.min() * 1e-3


def matrix(path: Path, peak, bw, static):
    df = pd.read_parquet(path)
    df = df[df.gemm_dtype == "bfloat16"]
    df = df.groupby(["m", "n", "k"], as_index=False)["latency"].median().sort_values(["m", "n", "k"])
    m, n, k = (df[c].astype(float) for c in "mnk")
    flops = 2 * m * n * k
    net = df.latency * 1e-3 - static
    keep = (flops / (2 * (m * k + k * n + m * n)) > peak / bw) & (net >= MIN_NET_S)
    return bucket_median(flops[keep], flops[keep] / (net[keep] * peak))


def memory(path: Path, bw, static):
    df = pd.read_parquet(path)
    df = df[(df.kv_cache_dtype == "bfloat16") & (df.window_size == 0) & (df.beam_width == 1)
            & (df.num_heads == df.num_key_value_heads)]
    df = df.sort_values(["batch_size", "num_heads", "head_dim", "isl", "step"])
    b = df.batch_size.astype(float)
    nbytes = 4.0 * b * (df.isl + df.step) * df.num_key_value_heads * df.head_dim \
        + 4.0 * b * df.num_heads * df.head_dim
    net = df.latency * 1e-3 - static
    keep = net >= MIN_NET_S
    return bucket_median(nbytes[keep], nbytes[keep] / (net[keep] * bw))


def yfloat(x):
    """YAML float with a dot and a signed exponent, e.g. 3.162e+06, 1.0e+09."""
    mant, exp = f"{x:.3e}".split("e")
    mant = mant.rstrip("0")
    return f"{mant}0e{exp}" if mant.endswith(".") else f"{mant}e{exp}"


def yeff(e):
    s = f"{e:.3f}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def ypoints(pts):
    return "[" + ", ".join(f"[{yfloat(s)}, {yeff(e)}]" for s, e in pts) + "]"


def rel(p: Path, data: Path):
    parts = p.relative_to(data).parts  # <system>/<op>/<fw>/<ver>/<file>
    return "systems/data/" + "/".join(parts), f"{parts[2]} {parts[3]}"


def notes(clipped, zero, over):
    s = f"; {over} of them individually above 1" if over else ""
    s += "".join(f"; bucket {yfloat(x)} median {m:.3f} > 1, clipped to 1.0" for x, m in clipped)
    return s + "".join(f"; bucket {yfloat(x)} median rounds to 0, dropped" for x in zero)


def derive(device, aic_root: Path, out: Path):
    sysname, fpeak, bpeak = DEVICES[device]
    data = aic_root / "systems" / "data"
    gpath = find_table(data / sysname, "gemm", "gemm_perf.parquet")
    if gpath is None:
        print(f"{device}: no gemm table, skipped")
        return
    static = static_latency(gpath)
    mpts, *mnote, mn, mover = matrix(gpath, fpeak, bpeak, static)
    gtab, gfw = rel(gpath, data)
    st, net = f"static = {yfloat(static)} s", f"latency - static >= {MIN_NET_S * 1e6:g} us"
    lines = ["calibration:", f"  kernel_static_latency_s: {yfloat(static)}", "  efficiency:",
             "    matrix:", "      size: flops", f"      points: {ypoints(mpts)}"]
    src = [f'    kernel_static_latency_s: "{PKG}, {gtab} ({gfw}): minimum measured latency over all '
           f'bfloat16 GEMM shapes (ms column * 1e-3)"',
           f'    efficiency.matrix: "{PKG}, {gtab} ({gfw}): median over shapes in the bucket of '
           f'2mnk / ((latency - static) * peak), {st}, peak = {fpeak:.4g} FLOP/s (datasheet dense '
           f'bf16); half-decade FLOP buckets, >= {MIN_SHAPES} shapes each; bfloat16 shapes with '
           f'2mnk / (2(mk+kn+mn)) > peak / HBM peak ({bpeak:.4g} B/s) and {net}; '
           f'{mn} shapes{notes(*mnote, mover)}"']
    apath = find_table(data / sysname, "attention", "generation_attention_perf.parquet")
    if apath is not None:
        bpts, *bnote, bn, bover = memory(apath, bpeak, static)
        lines += ["    memory:", "      size: bytes", f"      points: {ypoints(bpts)}"]
        atab, afw = rel(apath, data)
        src.append(f'    efficiency.memory: "{PKG}, {atab} ({afw}): decode attention, bf16 KV, MHA '
                   f'(num_heads == num_key_value_heads), full attention, beam 1; median over rows in '
                   f'the bucket of bytes / ((latency - static) * peak), bytes = 4*batch*(isl+step)*'
                   f'kv_heads*head_dim + 4*batch*num_heads*head_dim, {st} (from the GEMM table), '
                   f'peak = {bpeak:.4g} B/s (datasheet HBM); half-decade byte buckets, '
                   f'>= {MIN_SHAPES} rows each; {net}; {bn} rows{notes(*bnote, bover)}"')
    text = "\n".join(lines + ["  sources:"] + src) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{device}.yaml").write_text(text)
    print(f"{device}: wrote {out / (device + '.yaml')}")
    print(f"  matrix: {mn} shapes{notes(*mnote, mover)}")
    if apath is not None:
        print(f"  memory: {bn} rows{notes(*bnote, bover)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aic-root", required=True, type=Path,
                    help="installed aiconfigurator_core package dir (holds systems/data)")
    ap.add_argument("--out", default=Path("tools/calibration_out"), type=Path)
    ap.add_argument("--device", action="append", choices=sorted(DEVICES))
    a = ap.parse_args()
    for dev in a.device or DEVICES:
        derive(dev, a.aic_root, a.out)


if __name__ == "__main__":
    main()
