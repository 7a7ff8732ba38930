"""Measure this machine's peaks with torch and print a ``cpu-local`` device YAML.

Why: the closed loop (profile → predict → run for real) needs a device file whose numbers come
from the machine itself, not a datasheet. Every value is the best (max rate / min latency) of a
few timed repeats, with torch's own thread count, so the figures are what torch can reach:

- matrix FLOP/s: ``torch.mm`` of two N×N matrices (N = 2048 fp32, 1024 bf16), 2N³ FLOPs;
- vector FLOP/s (fp32): in-place ``addcmul_`` (2 FLOPs per element) on a 256 KiB tensor that
  stays in L2, so it is bounded by the ALUs and torch's per-call cost, not DRAM;
- memory bandwidth: ``copy_`` of a 512 MiB fp32 tensor, read + write bytes counted;
- on-chip: last-level cache size from sysfs; its bandwidth from ``copy_`` of a 4 MiB tensor
  (read + write = 8 MiB, within the LLC);
- capacity: MemTotal from /proc/meminfo;
- clock: cpu0's maximum frequency from sysfs cpufreq, else the "cpu MHz" of /proc/cpuinfo (under
  a hypervisor often the nominal clock, not the boost clock); resources: one unit each, since
  every rate is measured over all threads;
- kernel static latency: ``torch.add`` of two 1-element tensors (the per-op cost of eager torch).

Usage: ``python tools/measure_cpu_local.py [--threads N] > src/perfcast/hardware/devices/cpu-local.yaml``
(the shipped file uses torch's default thread count, all cores; measure with ``--threads 1`` to
compare with a single-thread run, see ``benchmarks/validate_cpu_local.py --device-file``).
"""

from __future__ import annotations

import datetime
import platform
import time
from pathlib import Path

import torch


def best_time(fn, repeats: int = 7, inner: int = 1) -> float:
    """Minimum over ``repeats`` of the mean time of ``inner`` back-to-back calls (after warm-up)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def matrix_rate(dtype: torch.dtype, n: int) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / best_time(lambda: torch.mm(a, b), repeats=5)


def vector_rate() -> float:
    x, y, z = (torch.randn(64 * 1024) for _ in range(3))
    return 2 * x.numel() / best_time(lambda: x.addcmul_(y, z, value=1e-9), inner=200)


def copy_bandwidth(nbytes: int, inner: int) -> float:
    src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
    return 2 * nbytes / best_time(lambda: dst.copy_(src), inner=inner)


def llc_bytes() -> int:
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        scale = {"K": 1024, "M": 1024**2}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes)


def ram_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def clock_hz() -> tuple[float, str]:
    """(clock, where it was read)."""
    cpufreq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if cpufreq.exists():
        return int(cpufreq.read_text()) * 1e3, f"{cpufreq} (maximum frequency of cpu0)"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            mhz = line.split(":")[1].strip()
            return float(mhz) * 1e6, (f"/proc/cpuinfo 'cpu MHz: {mhz}' (no cpufreq in sysfs: the "
                                      f"kernel-reported clock, not necessarily the boost clock)")
    raise RuntimeError("no cpufreq in sysfs and no 'cpu MHz' in /proc/cpuinfo")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="measure this machine and print a cpu-local device YAML")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch threads (default: torch's own, i.e. all cores)")
    torch.set_num_threads(ap.parse_args().threads)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    stamp = (f"measured on this machine by tools/measure_cpu_local.py ({datetime.date.today()}, "
             f"torch {torch.__version__}, {threads} threads)")
    a = torch.ones(1)
    values = {
        "matrix_fp32": (matrix_rate(torch.float32, 2048), "torch.mm 2048x2048x2048 fp32, best of 5, 2n^3 FLOPs"),
        "matrix_bf16": (matrix_rate(torch.bfloat16, 1024), "torch.mm 1024x1024x1024 bf16, best of 5, 2n^3 FLOPs"),
        "vector_fp32": (vector_rate(), "in-place addcmul_ on 65536 fp32 elements (L2-resident), 2 FLOPs per element, best of 7x200 calls"),
        "mem_bw": (copy_bandwidth(512 * 1024**2, 3), "copy_ of a 512 MiB fp32 tensor, read + write bytes, best of 7x3"),
        "onchip_bw": (copy_bandwidth(4 * 1024**2, 50), "copy_ of a 4 MiB fp32 tensor (within the last-level cache), read + write bytes, best of 7x50"),
        "static": (best_time(lambda: torch.add(a, a), inner=2000), "torch.add of two 1-element fp32 tensors, best of 7x2000 calls"),
    }
    ram, llc = ram_bytes(), llc_bytes()
    clock, clock_where = clock_hz()
    engine = f"whole-machine engine: the rate is measured over all {threads} torch threads, priced as one unit"
    cpu = platform.processor() or platform.machine()
    print(f"""name: cpu-local
description: "This machine's CPU ({cpu}, {threads} torch threads), measured with torch"
vendor: local
datasheet:
  matrix_flops_per_s:
    fp32: {values['matrix_fp32'][0]:.4e}
    bf16: {values['matrix_bf16'][0]:.4e}
  vector_flops_per_s:
    fp32: {values['vector_fp32'][0]:.4e}
  hbm_capacity_bytes: {ram:.4e}
  hbm_bandwidth_bytes_per_s: {values['mem_bw'][0]:.4e}
  onchip_capacity_bytes: {llc:.4e}
  onchip_bandwidth_bytes_per_s: {values['onchip_bw'][0]:.4e}
  clock_hz: {clock:.4e}
  resources:
    matrix: 1
    vector: 1
    hbm: 1
    onchip: 1
sources:
  matrix_flops_per_s.fp32: "{stamp}: {values['matrix_fp32'][1]}"
  matrix_flops_per_s.bf16: "{stamp}: {values['matrix_bf16'][1]}"
  vector_flops_per_s.fp32: "{stamp}: {values['vector_fp32'][1]}"
  hbm_capacity_bytes: "{stamp}: MemTotal from /proc/meminfo (system RAM plays the role of HBM)"
  hbm_bandwidth_bytes_per_s: "{stamp}: {values['mem_bw'][1]}"
  onchip_capacity_bytes: "{stamp}: largest cache level of cpu0 in /sys/devices/system/cpu/cpu0/cache (last-level cache)"
  onchip_bandwidth_bytes_per_s: "{stamp}: {values['onchip_bw'][1]}"
  clock_hz: "read on this machine from {clock_where}; the cycle of reservation tables, not a peak"
  resources.matrix: "{engine}; on a CPU matrix and vector work share the cores' FMA pipes, which separate resources cannot express, so overlapping them is optimistic"
  resources.vector: "{engine} (the same cores as matrix)"
  resources.hbm: "{engine}: the measured DRAM copy bandwidth"
  resources.onchip: "{engine}: the measured last-level-cache copy bandwidth"
calibration:
  kernel_static_latency_s: {values['static'][0]:.4e}
  efficiency: {{}}
  sources:
    kernel_static_latency_s: "{stamp}: {values['static'][1]}"
""")


if __name__ == "__main__":
    main()
