"""Regenerate the profiling databases shipped in ``src/perfcast/data/profiling/``.

For each device perfcast ships and each framework aiconfigurator-core 0.12.0 measured on it
(TensorRT-LLM, vLLM, SGLang), imports the newest framework version holding the GEMM and
attention tables (``perfcast db import aiconfigurator`` without ``--version``), with every
dtype, as gzip-compressed tables; then checks the result and prints the sizes.

Run: ``python tools/ship_profiling_databases.py --aic-root PATH/aiconfigurator_core
[--device D ...]`` (default: the installed package, every device). ``--device`` regenerates only
those devices' databases and leaves the others' files (and their MANIFEST import dates) as they
are. Needs aiconfigurator-core==0.12.0's data, never at test time.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from perfcast.db.aiconfigurator import default_root, import_aiconfigurator
from perfcast.db.check import inspect
from perfcast.inference.silicon import tables
from perfcast.perf.databases import shipped_root

#: aiconfigurator system → perfcast device, as the validation maps them (``data/validation/mapping.yaml``
#: ``systems``, with each one's source: ``a100_sxm`` is the SXM4 80 GB part, its tables naming the device
#: "NVIDIA A100-SXM4-80GB"; ``gb200`` and ``gb300`` are one GPU of a GB200 / GB300 NVL72 rack, measured
#: on one 4-GPU compute tray; ``b300_sxm`` is one B300 of an HGX B300 board)
SYSTEMS = {s: v["device"] for s, v in tables()["systems"].items() if v.get("device")}
FRAMEWORKS = ("trtllm", "vllm", "sglang")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aic-root", type=Path, default=None, help="the aiconfigurator_core package directory")
    p.add_argument("--out", type=Path, default=shipped_root(), help="database root (default: the shipped one)")
    p.add_argument("--device", action="append", choices=sorted(SYSTEMS.values()),
                   help="only these devices (repeatable; default: every device)")
    args = p.parse_args()
    chosen = {s: d for s, d in SYSTEMS.items() if not args.device or d in args.device}
    aic = args.aic_root or default_root()
    if aic is None:
        raise SystemExit("aiconfigurator_core is not importable; pass --aic-root")
    for device in chosen.values():
        shutil.rmtree(args.out / device, ignore_errors=True)  # no stale version directories
    for system, device in chosen.items():
        for framework in FRAMEWORKS:
            got = import_aiconfigurator(aic, system, framework, None, args.out, device)
            rows = sum(got["tables"].values())
            print(f"{device} {framework} {got['version']}: {rows:,} rows"
                  + (f"; missing {', '.join(got['missing'])}" if got["missing"] else ""))
    report = inspect(args.out)
    if report.problems:
        raise SystemExit("\n".join(report.problems))
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"checked: {report.tables} tables, {report.rows:,} rows, {size / 1e6:.1f} MB on disk")
    for device in chosen.values():
        mine = sum(f.stat().st_size for f in (args.out / device).rglob("*") if f.is_file())
        print(f"  {device}: {mine / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
