"""``perfcast collective``: the time of one collective on a topology tier, with the algorithm
chosen, the links it uses and its α–β formula."""

from __future__ import annotations

import json
import sys

from rich.console import Console

from perfcast.cli.args import number
from perfcast.report.format import seconds, si


def add_parser(sub) -> None:
    p = sub.add_parser("collective", help="price one collective on a topology tier",
                       description="α–β cost of a collective on a torus, ring, switch or full mesh.")
    p.add_argument("op", help="all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, send_recv")
    p.add_argument("--topology", required=True, metavar="KIND:SHAPE",
                   help="torus:2x2x2, mesh:4x4 (no wraparound), ring:8, switch:8, full_mesh:8")
    p.add_argument("--link-bandwidth", required=True, metavar="B/s", help="per link, per direction")
    p.add_argument("--link-latency", default="0", metavar="S", help="per hop (default 0)")
    p.add_argument("--bytes", required=True, metavar="N", help="message size per device")
    p.add_argument("--group-size", type=int, help="devices taking part (default: the whole tier)")
    p.add_argument("--algorithm", help="force ring, multiport, tree or direct")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.hardware.topology import parse_tier
    from perfcast.perf.collectives import cost

    tier = parse_tier(args.topology, number(args.link_bandwidth, "--link-bandwidth", "B/s"),
                      number(args.link_latency, "--link-latency", "S"))
    nbytes = number(args.bytes, "--bytes", "N")
    c = cost(args.op, int(nbytes) if float(nbytes).is_integer() else nbytes, tier, args.group_size, args.algorithm)
    doc = {"op": c.op, "topology": tier.name, "group_size": args.group_size or tier.size,
           "bytes": nbytes, "time_s": float(c.time_s), "algorithm": c.algorithm,
           "links_per_node": tier.links_per_device, "links_used": c.links_used, "formula": c.formula}
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    Console().print(f"{c.op} of {si(float(nbytes), 'B')} over {doc['group_size']} devices of {tier.name} "
                    f"({tier.links_per_device} links per device): {seconds(float(c.time_s))} "
                    f"by {c.algorithm} — {c.formula}", highlight=False)
    return 0
