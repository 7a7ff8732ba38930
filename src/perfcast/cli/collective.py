"""``perfcast collective``: the time of one collective on a topology, with the algorithm
chosen, the links it uses, the tiers it crosses and its α–β formula."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import BYTES, NON_NEGATIVE, POSITIVE, devices, refuse
from perfcast.cli.devices import ad_hoc
from perfcast.report.document import check, emit
from perfcast.report.format import seconds, si


def add_parser(sub) -> None:
    p = sub.add_parser("collective", help="price one collective on a topology",
                       description="α–β cost of a collective on a shipped topology (hgx-h200, …), a "
                                   "topology YAML file, or an ad-hoc torus, ring, switch or full mesh.")
    p.add_argument("op", help="all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, send_recv "
                              "(or with hyphens: all-gather, …)")
    p.add_argument("--topology", required=True, metavar="NAME|FILE|KIND:SHAPE",
                   help="a shipped topology (perfcast topologies), a YAML file, or torus:2x2x2, "
                        "mesh:4x4 (no wraparound), ring:8, switch:8, full_mesh:8")
    p.add_argument("--link-bandwidth", type=POSITIVE, metavar="B/s",
                   help="per link, per direction (ad-hoc shapes only)")
    p.add_argument("--link-latency", type=NON_NEGATIVE, default=0, metavar="S",
                   help="per hop (ad-hoc shapes; default 0)")
    p.add_argument("--bytes", type=BYTES, required=True, metavar="N", help="message size per device")
    p.add_argument("--group-size", type=devices(),
                   help="devices taking part (default: the innermost tier; larger groups span tiers)")
    p.add_argument("--stride", type=devices(), default=1,
                   help="distance between consecutive group members (e.g. 8: one GPU per node)")
    p.add_argument("--algorithm", help="force ring, multiport, tree, direct or hierarchical")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.hardware.topology import resolve_topology
    from perfcast.perf.collectives import topology_cost

    adhoc = ad_hoc(args.topology)
    for flag in ("--link-bandwidth", "--link-latency"):
        refuse(args, (flag, adhoc, f"applies to ad-hoc KIND:SHAPE topologies; {args.topology} gives its own"))
    topo = resolve_topology(args.topology, args.link_bandwidth, args.link_latency)
    nbytes = args.bytes
    group = args.group_size if args.group_size is not None else topo.tiers[0].size
    op = args.op.replace("-", "_")  # all-gather, as the docs write it, is all_gather
    c = topology_cost(op, int(nbytes) if float(nbytes).is_integer() else nbytes, topo.with_devices(group * args.stride),
                      group, args.stride, args.algorithm)
    span = [(t.name, k) for t, k in topo.with_devices(group * args.stride).span(group, args.stride) if k > 1]
    doc = {"op": c.op, "topology": topo.name, "group_size": group, "stride": args.stride,
           "bytes": nbytes, "time_s": float(c.time_s), "algorithm": c.algorithm,
           "links_per_node": topo.tiers[0].links_per_device, "links_used": c.links_used,
           "tiers": [{"tier": n, "devices": k} for n, k in span], "formula": c.formula}
    if args.json:
        return emit(doc)
    check(doc)
    where = " × ".join(f"{k} on {n}" for n, k in span) or "one device"
    Console().print(f"{c.op} of {si(float(nbytes), 'B')} over {group} devices of {topo.name} ({where}; "
                    f"{topo.tiers[0].links_per_device} links per device): {seconds(float(c.time_s))} "
                    f"by {c.algorithm} — {c.formula}", highlight=False, markup=False)
    return 0
