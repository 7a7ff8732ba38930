"""``perfcast kernel``: price a catalog kernel at a design point, optionally over a sweep."""

from __future__ import annotations

import itertools

import sympy

from rich.console import Console

from perfcast.cli.args import (POSITIVE, add_report_arguments, assignment, design_value, refuse, report_files,
                               report_paths, sweep, written)
from perfcast.cli.devices import ad_hoc, add_device_arguments, resolve_device
from perfcast.inference.slow import SlowComparison, schedule
from perfcast.inputs import excerpt
from perfcast.ir import UserError, render
from perfcast.ir.symbols import HARDWARE
from perfcast.kernels import get_kernel
from perfcast.perf import AnalyticPerformanceModel
from perfcast.report import kernel as report
from perfcast.report import slow as slow_report
from perfcast.report.document import check, emit
from perfcast.rollup import OVERLAPS, overlap, rollup
from perfcast.rollup.overlap import SUMMARY, parse


def add_parser(sub) -> None:
    p = sub.add_parser("kernel", help="price a DSL kernel from the catalog (see `perfcast kernels`)",
                       description="Price a catalog kernel: closed-form FLOPs, bytes and time, "
                                   "numbers at a design point, and a table over a sweep.")
    p.add_argument("name", help="kernel name, e.g. flash-attention")
    add_device_arguments(p, topology=True)
    p.add_argument("--set", action="append", default=[], metavar="SYM=VALUE",
                   help="set a design symbol (or a --symbolic-hw parameter); repeatable")
    p.add_argument("--sweep", action="append", default=[], metavar="SYM=v1,v2,...",
                   help="evaluate over these values (several --sweep: their product)")
    p.add_argument("--symbolic-hw", action="append", default=[], metavar="PARAM",
                   help="keep a hardware parameter symbolic (e.g. hbm_bandwidth_bytes_per_s); "
                        "its value then comes from --set/--sweep or the device")
    p.add_argument("--padded", action="store_true",
                   help="trace with padded (ceil) tiling: tile counts round up instead of "
                        "requiring the tile size to divide the extent")
    p.add_argument("--topology", metavar="NAME|FILE|KIND:SHAPE",
                   help="price the kernel's collectives on this topology: its mesh axes are laid out "
                        "in declaration order, the first innermost (see `perfcast topologies`)")
    p.add_argument("--link-bandwidth", type=POSITIVE, metavar="B/s",
                   help="per link, per direction (ad-hoc KIND:SHAPE only)")
    add_overlap_argument(p)
    add_rollup_arguments(p)
    p.add_argument("--tree", action="store_true", help="print the op tree with rolled-up costs")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_report_arguments(p)
    p.set_defaults(run=run)


def add_overlap_argument(p) -> None:
    g = p.add_argument_group("overlap (rewrites of the fast roll-up's sum; see docs/design/rollup.md)")
    g.add_argument("--overlap", action="append", default=[], metavar="NAME",
                   help=f"apply an overlap transform: {', '.join(OVERLAPS)}, or all; repeatable "
                        f"(applied in that order whatever the order given)")


def add_rollup_arguments(p) -> None:
    g = p.add_argument_group("roll-up (see docs/design/slow-rollup.md)")
    g.add_argument("--rollup", choices=("fast", "slow", "both"), default="fast",
                   help="fast: the closed-form sum (default); slow: a modulo schedule over the device's "
                        "resources at the design point; both: side by side, with the gap per loop")
    g.add_argument("--chrome-trace", metavar="FILE",
                   help="write the slow roll-up's schedule (one track per resource) for Perfetto")


def overlap_notes(transforms) -> list[str]:
    return [f"overlap {t}: {SUMMARY[t]}" for t in transforms]


def _topology(args):
    """The ``--topology`` (None without one); ``--link-bandwidth`` sets an ad-hoc one's links."""
    from perfcast.hardware.topology import resolve_topology

    if not args.topology:
        refuse(args, ("--link-bandwidth", False, "sets the links of an ad-hoc --topology KIND:SHAPE; "
                                                 "no --topology given"))
        return None
    refuse(args, ("--link-bandwidth", ad_hoc(args.topology), f"applies to ad-hoc KIND:SHAPE topologies; "
                                                             f"{args.topology} gives its own"))
    return resolve_topology(args.topology, args.link_bandwidth)


def _meshes(spec, topo):
    """A function from a design point to the hardware mesh of the kernel's axes at that point
    (None without a topology)."""
    if topo is None:
        return lambda point: None
    from perfcast.hardware.topology import Mesh

    if not spec.mesh_axes:
        raise UserError(f"--topology: kernel {spec.name} declares no device mesh (it runs on one device)")

    def mesh(point):
        sizes = []
        for axis, size in spec.mesh_axes:
            expr = sympy.sympify(size)
            value = expr.subs({s: point[s.name] for s in expr.free_symbols if s.name in point})
            if not value.is_Integer or value < 1:
                raise UserError(f"mesh axis {axis} = {size} is not a positive integer at the design point ({value})")
            sizes.append((axis, int(value)))
        n = 1
        for _, v in sizes:
            n *= v
        return Mesh.ordered(topo.with_devices(n), sizes)

    return mesh


def _design_point(args) -> tuple[list, list]:
    """(``--set`` (symbol, value) pairs, ``--sweep`` (symbol, values) axes), each value checked
    by its symbol's kind before anything is traced: a hardware parameter (``--symbolic-hw``) is
    a positive number within a device file's bounds, every other symbol a DSL size (a positive integer). A symbol set
    or swept twice is an error, not a silent last-one-wins or a product with itself."""
    sets = [assignment(text, "--set") for text in args.set]
    axes = [sweep(text, "--sweep") for text in args.sweep]
    seen: dict[str, str] = {}
    for flag, sym in [*(("--set", s) for s, _ in sets), *(("--sweep", a) for a, _ in axes)]:
        if sym in seen:
            raise UserError(f"{flag} {sym}: {sym} is given by {seen[sym]} already; give it once")
        seen[sym] = flag
    return ([(s, design_value("--set", s, v, size=s not in HARDWARE)) for s, v in sets],
            [(a, [design_value("--sweep", a, v, size=a not in HARDWARE) for v in vs]) for a, vs in axes])


def run(args) -> int:
    transforms = parse(args.overlap)
    refuse(args, ("--tree", not args.json, "prints the op tree as text; --json has no tree"),
           ("--overlap", args.rollup != "slow", "rewrites the fast roll-up's sum, which --rollup slow does not "
                                               "show; use --rollup both"),
           ("--sweep", args.rollup != "slow", "the slow roll-up schedules the design point only; use --rollup "
                                             "both to see the sweep beside it"))
    sets, axes = _design_point(args)
    report_paths(args)
    spec = get_kernel(args.name)
    refuse(args, ("--padded", not spec.padded, f"kernel {spec.name} is traced with padded tiling already"))
    topo = _topology(args)
    device = resolve_device(args, topo)
    graph = spec.padded_graph if args.padded else spec.graph
    mesh_at = _meshes(spec, topo)
    cache: dict = {}

    def priced(pt):
        """The roll-up on the mesh of the point (one per distinct mesh)."""
        mesh = mesh_at(pt)
        key = None if mesh is None else mesh.axes
        if key not in cache:
            try:
                model = AnalyticPerformanceModel(device, symbolic=args.symbolic_hw, mesh=mesh)
            except ValueError as e:
                raise UserError(f"--symbolic-hw: {e}") from None
            cache[key] = (model, rollup(graph, model))
        return cache[key]

    point: dict[str, int | float] = dict(spec.defaults)
    model, r = priced(point)
    for name in args.symbolic_hw:
        point[name] = _hw_default(device, name, r)
    if args.chrome_trace and args.rollup == "fast":
        raise UserError("--chrome-trace writes the slow roll-up's schedule: add --rollup slow or both")
    from perfcast.rollup.slow import table_symbols

    known = {s.name for s in r.free_symbols} | table_symbols(graph)
    for sym in [*point, *(s for s, _ in sets), *(a for a, _ in axes)]:
        if sym not in known:
            raise UserError(f"unknown symbol {excerpt(sym)} for kernel {spec.name}; "
                            f"its symbols are {', '.join(sorted(known))}")
    point.update(sets)

    model, r = priced(point)
    own = {x.name for x in r.free_symbols}

    def fast_point(pt):  # symbols only a reservation table uses are the slow roll-up's
        return {k: v for k, v in pt.items() if k in own}

    ev = r.evaluate(fast_point(point))
    overlaps: dict = {}  # id(roll-up) → its overlap roll-up

    def overlapped(rr, pt):
        if id(rr) not in overlaps:
            overlaps[id(rr)] = overlap(rr, transforms)
        return overlaps[id(rr)].evaluate(fast_point(pt))

    evals, sweep_ov = [], []
    for combo in itertools.product(*(v for _, v in axes)) if axes else ():
        pt = {**point, **dict(zip([a for a, _ in axes], combo))}
        rr = priced(pt)[1]
        evals.append(rr.evaluate(fast_point(pt)))
        if transforms:
            sweep_ov.append(overlapped(rr, pt))
    oev = overlapped(r, point) if transforms else None
    ov = overlaps.get(id(r))
    notes = [*spec.notes, *_notes(model, r, transforms)]
    slow = None
    if args.rollup != "fast":
        slow = SlowComparison(schedule(model, device, graph, point, ev.launch_time_s), ev.time_s)
        if args.chrome_trace:
            written("--chrome-trace", args.chrome_trace, slow_report.chrome_trace, slow.slow, args.chrome_trace,
                    spec.name)
    # figures derived from the time (e.g. a control rate): (roll-up, time, point, figures) at the
    # point, at each sweep point, and at the slow roll-up's time
    times = [("fast", oev.after_s if oev else ev.time_s, ev.point)] + [
        ("fast", o.after_s if o else e.time_s, e.point) for e, o in zip(evals, sweep_ov or [None] * len(evals))]
    if slow is not None:
        times.append(("slow", slow.slow.time_s, ev.point))
    figures = [(*t, spec.figures_at(*t[1:])) for t in times] if spec.figures else []
    doc = report.to_json(spec.name, device, r, ev, evals, notes, ov, oev, sweep_ov)
    if figures:
        doc["figures"] = figures[0][3]
        for entry, f in zip(doc.get("sweep", []), figures[1:1 + len(evals)]):
            entry["figures"] = f[3]
    if slow is not None:
        doc["slow"] = slow.as_dict()
        if figures:
            doc["slow"]["figures"] = figures[-1][3]
        if args.rollup == "slow":
            doc["rollup"] = "slow"
    check(doc)  # the tables and figures below show the same figures
    wrote = []
    if args.plot or args.html:
        from perfcast.report import plots_step

        wrote = report_files(args, doc, plots_step.kernel, spec.name, device, r, ev, evals, [a for a, _ in axes],
                             sweep_ov)
    if args.json:
        return emit(doc)
    console = Console(width=max(120, Console().width))
    if args.tree:
        console.print(render(graph), markup=False, highlight=False)
    if args.rollup != "slow":
        report.render(console, spec.name, device, r, ev, evals, [a for a, _ in axes], notes, ov, oev, sweep_ov)
    if slow is not None:
        if args.rollup == "slow":
            console.print(f"[bold]{spec.name}[/] on [bold]{device.name}[/] at "
                          + ", ".join(f"{k}={v:g}" for k, v in point.items()))
        slow_report.render(console, slow)
    if figures:
        report.figures_table(console, spec.figures, figures[1:] if args.rollup == "slow" else figures,
                             [a for a, _ in axes])
    for line in wrote:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0


def _hw_default(device, name: str, r) -> float:
    """The device's value of a hardware parameter kept symbolic."""
    if name == "matrix_flops_per_s":
        dtypes = {lt.leaf.dtype for lt in r.leaves if "flops.matrix" in lt.leaf.cost}
        return float(device.matrix_flops_per_s(sorted(dtypes)[0] if dtypes else "bf16"))
    if name == "vector_flops_per_s":
        return float(device.vector_flops_per_s("fp32"))
    return float(getattr(device, name))


def _notes(model, r, transforms=()) -> list[str]:
    notes = [f"{u} efficiency: no calibration curve for {model.device.name}; priced at datasheet peak"
             for u in model.uncalibrated()
             if any(("flops." + u if u != "memory" else "bytes.hbm") in lt.leaf.cost for lt in r.leaves)]
    on: dict[str, list[str]] = {}  # a note → the leaves it is on (a model repeats it per leaf)
    for lt in r.leaves:
        for n in lt.result.notes:
            if lt.name not in on.setdefault(n, []):
                on[n].append(lt.name)
    for n, names in on.items():
        notes.append(f"{names[0]}: {n}" if len(names) == 1 else f"{n}: {len(names)} leaves "
                     f"({', '.join(names[:3])}{', …' if len(names) > 3 else ''})")
    if not transforms:
        notes.append("fast roll-up: leaves are summed without overlap (no load/compute pipelining)")
        return notes
    notes.append(f"fast roll-up: leaves are summed except where the overlap transforms rewrite the sum "
                 f"({', '.join(transforms)}); the leaf table keeps each leaf's own time")
    return notes + overlap_notes(transforms)
