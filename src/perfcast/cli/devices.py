"""``perfcast devices``: the shipped device catalog; device resolution for other commands."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from perfcast.cli.args import refuse
from perfcast.hardware import Device, device_names, get_device, load_device_file
from perfcast.ir import UserError
from perfcast.report.document import check, emit
from perfcast.report.format import si

#: the device a command prices on when neither --device, --device-file nor a topology names one
DEFAULT_DEVICE = "h100-sxm"


def ad_hoc(topology: str) -> bool:
    """Whether ``--topology`` names an ad-hoc ``KIND:SHAPE`` tier (not a shipped name or a file)."""
    return ":" in topology and not topology.endswith((".yaml", ".yml"))


def add_device_arguments(p, topology: bool = False) -> None:
    """--device and --device-file (one or the other)."""
    default = f"the --topology's device, else {DEFAULT_DEVICE}" if topology else DEFAULT_DEVICE
    p.add_argument("--device", help=f"device name (default: {default}; see `perfcast devices`)")
    p.add_argument("--device-file", metavar="PATH", help="a device YAML file (instead of --device)")


def resolve_device(args, topology=None) -> Device:
    """The device of ``--device`` or ``--device-file``; with neither, the device ``topology`` (a
    :class:`perfcast.hardware.topology.Topology`) is built from, else DEFAULT_DEVICE. A device
    that is not the topology's is an error: its links and their bandwidth are the topology's."""
    refuse(args, ("--device", not args.device_file, "give a device name or --device-file, not both"))
    if args.device_file:
        device = load_device_file(args.device_file)
    else:
        device = get_device(args.device or (topology.device if topology is not None and topology.device
                                            else DEFAULT_DEVICE))
    if topology is not None and topology.device and device.name != topology.device:
        from perfcast.hardware.topology import get_topology, topology_names

        flag = "--device-file" if args.device_file else "--device"
        own = [n for n in topology_names() if get_topology(n).device == device.name]
        raise UserError(f"{flag}: {device.name} is not the device of topology {topology.name} ({topology.device}); "
                        f"drop {flag} to price on {topology.device}, or pass "
                        + (f"--topology {' or '.join(own)}" if own else f"a topology file of {device.name} devices"))
    return device


def add_parser(sub) -> None:
    p = sub.add_parser("devices", help="list the shipped devices",
                       description="List the shipped device specs (or check one file).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--device-file", metavar="PATH", help="validate and show this YAML file")
    what.add_argument("--template", action="store_true",
                      help="print a commented device file to start your own from (perfcast devices "
                           "--template > my-device.yaml)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _template(what: str, args) -> int:
    from perfcast.hardware.spec import template_path

    if args.json:
        raise UserError("--template prints a YAML file; --json does not apply")
    sys.stdout.write(template_path(what).read_text())
    return 0


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
    if args.template:
        return _template("device", args)
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
    what = p.add_mutually_exclusive_group()
    what.add_argument("--topology-file", metavar="PATH", help="validate and show this YAML file")
    what.add_argument("--template", action="store_true",
                      help="print a commented topology file to start your own from (perfcast topologies "
                           "--template > my-topology.yaml)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_topologies)


def run_topologies(args) -> int:
    from perfcast.hardware.topology import get_topology, load_topology_file, topology_names

    if args.template:
        return _template("topology", args)
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
