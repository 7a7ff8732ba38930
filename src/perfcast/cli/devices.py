"""``perfcast devices``: the shipped device catalog; device resolution for other commands."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.hardware import Device, device_names, get_device, load_device_file
from perfcast.report.document import check, emit
from perfcast.report.format import si


def resolve_device(name: str, path: str | None) -> Device:
    return load_device_file(path) if path else get_device(name)


def add_parser(sub) -> None:
    p = sub.add_parser("devices", help="list the shipped devices",
                       description="List the shipped device specs (or check one file).")
    p.add_argument("--device-file", metavar="PATH", help="validate and show this YAML file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _row(d: Device) -> dict:
    s = d.spec.datasheet
    return {
        "name": d.name,
        "description": d.spec.description,
        "matrix_flops_per_s": dict(s.matrix_flops_per_s),
        "vector_flops_per_s": dict(s.vector_flops_per_s),
        "hbm_capacity_bytes": s.hbm_capacity_bytes,
        "hbm_bandwidth_bytes_per_s": s.hbm_bandwidth_bytes_per_s,
        "onchip_capacity_bytes": s.onchip_capacity_bytes,
        "onchip_bandwidth_bytes_per_s": s.onchip_bandwidth_bytes_per_s,
        "clock_hz": s.clock_hz,
        "resources": d.resources,
        "links": {k: v.model_dump() for k, v in s.links.items()},
        "calibrated": [u for u in ("matrix", "vector", "memory") if d.efficiency(u) is not None],
        "file": str(d.path),
    }


def run(args) -> int:
    devices = [load_device_file(args.device_file)] if args.device_file else [get_device(n) for n in device_names()]
    rows = [_row(d) for d in devices]
    if args.json:
        return emit({"devices": rows})
    check(rows)
    t = Table(title="Devices")
    for col in ("name", "description", "bf16 matrix", "fp8 matrix", "HBM", "HBM bandwidth",
                "clock", "links", "calibrated"):
        t.add_column(col)
    for r in rows:
        m = r["matrix_flops_per_s"]
        links = ", ".join(f"{n} {v['count']}×{si(v['bandwidth_bytes_per_s'], 'B/s')}" for n, v in r["links"].items())
        t.add_row(r["name"], r["description"], si(m["bf16"], "FLOP/s") if "bf16" in m else "—",
                  si(m["fp8"], "FLOP/s") if "fp8" in m else "—", si(r["hbm_capacity_bytes"], "B"),
                  si(r["hbm_bandwidth_bytes_per_s"], "B/s"), si(r["clock_hz"], "Hz"), links,
                  ", ".join(r["calibrated"]) or "none")
    Console(width=max(160, Console().width)).print(t)
    return 0


def add_topologies_parser(sub) -> None:
    p = sub.add_parser("topologies", help="list the shipped topologies",
                       description="List the shipped topologies (or check one file): tiers innermost first.")
    p.add_argument("--topology-file", metavar="PATH", help="validate and show this YAML file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_topologies)


def run_topologies(args) -> int:
    from perfcast.hardware.topology import get_topology, load_topology_file, topology_names

    topos = [load_topology_file(args.topology_file)] if args.topology_file else [get_topology(n) for n in topology_names()]
    rows = [{"name": t.name, "description": t.description, "device": t.device, "devices": t.size,
             "tiers": [{"name": x.name, "kind": x.kind, "shape": list(x.dims), "wraparound": x.wraparound,
                        "links_per_device": x.links_per_device,
                        "link_bandwidth_bytes_per_s": float(x.link_bandwidth_bytes_per_s),
                        "link_latency_s": float(x.link_latency_s),
                        "calibrated": sorted(op for op, _ in x.calibration)} for x in t.tiers],
             "file": str(t.path)} for t in topos]
    if args.json:
        return emit({"topologies": rows})
    check(rows)
    t = Table(title="Topologies (tiers innermost first)")
    for col in ("name", "device", "devices", "tiers", "calibrated"):
        t.add_column(col)
    for r in rows:
        tiers = "; ".join(f"{x['name']}: {x['kind']} {'x'.join(map(str, x['shape']))}"
                          f"{'' if x['wraparound'] or x['kind'] != 'torus' else ' (no wrap)'}, "
                          f"{x['links_per_device']}×{si(x['link_bandwidth_bytes_per_s'], 'B/s')}"
                          for x in r["tiers"])
        cal = "; ".join(f"{x['name']}: {', '.join(x['calibrated'])}" for x in r["tiers"] if x["calibrated"])
        t.add_row(r["name"], r["device"], str(r["devices"]), tiers, cal or "none")
    Console(width=max(160, Console().width)).print(t)
    return 0
