"""``perfcast calibrate``: fit the analytic model's kernel classes on a profiling database.

Reads measured kernels (GEMMs, attention, MoE, ... as ``perfcast db import`` or ``perfcast
profile`` wrote them), fits each class's calibrated form and measures it out of sample (k-fold by
shape), and writes a calibration file the analytic model loads for that device and engine.
"""

from __future__ import annotations

from pathlib import Path

from perfcast.ir import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the analytic kernel model on measured kernels",
                       description="Fit every kernel class a profiling database covers (k-fold "
                                   "by shape for the out-of-sample error) and write a calibration file.")
    p.add_argument("database", type=Path, help="a profiling database directory (holds op_mapping.yaml)")
    p.add_argument("--device", help="perfcast device the measurements are of (default, and the only one "
                                    "accepted: the database's)")
    p.add_argument("--out", type=Path, required=True,
                   help="calibration file to write (shipped ones live in "
                        "perfcast/hardware/calibration/<device>/<framework>-<version>.yaml)")
    p.add_argument("--only", action="append", metavar="CLASS",
                   help="fit only this kernel class (repeatable; e.g. gdn.chunked) and keep the other fits of an "
                        "existing --out file as they are: a class added to a shipped calibration file without "
                        "refitting the rest")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.db.calibrate import calibrate
    from perfcast.hardware import get_device
    from perfcast.inputs import dump_yaml
    from perfcast.perf.profiling import load_database

    if not (args.database / "op_mapping.yaml").exists():
        raise UserError(f"{args.database}: not a profiling database (no op_mapping.yaml)")
    source = load_database(args.database)
    device = get_device(args.device or source.mapping.device)
    source.fits(device.name)  # the fits are of the device the kernels were measured on
    if device.spec.datasheet.compute_units is None:
        raise UserError(f"device {device.name} has no datasheet compute_units (SMs, CUs); the kernel "
                        f"forms count waves against it")
    from perfcast.cli.progress import progress

    only = _classes(args.only)
    base = _merge_base(args.out, source.mapping) if only else None
    with progress(args, f"calibrating {device.name}", lines=True) as bar:
        doc = calibrate(args.database, device, _display(args.database), progress=bar.log, only=only)
    if not doc["fits"]:
        what = f" of class {', '.join(sorted(only))}" if only else ""
        raise UserError(f"{args.database}: no kernel table{what} the calibration covers has enough rows")
    if base is not None:
        doc = _merged(base, doc, only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# perfcast kernel calibration: {device.name}, {doc['framework']} {doc['version']}.\n"
              f"# Written by `perfcast calibrate`; do not edit by hand (see docs/design/pricing.md).\n")
    try:
        args.out.write_text(header + dump_yaml(doc, sort_keys=False, width=120))
    except OSError as e:
        raise UserError(f"--out {args.out}: cannot write ({e.strerror})") from None
    print(f"wrote {args.out}: {len(doc['fits'])} fits")
    return 0


def _classes(names) -> frozenset[str] | None:
    if not names:
        return None
    from perfcast.perf.kernel_classes import CLASSES

    unknown = [n for n in names if n not in CLASSES.keys()]
    if unknown:
        raise UserError(f"--only {unknown[0]}: no such kernel class (known: {', '.join(sorted(CLASSES.keys()))})")
    return frozenset(names)


def _merge_base(out: Path, mapping) -> dict | None:
    """The calibration ``--only`` merges into: ``out``'s, which must be of the database's framework and
    version (None: no file yet)."""
    from perfcast.inputs import load_yaml

    if not out.exists():
        return None
    old = load_yaml(out)
    if not isinstance(old, dict) or (old.get("framework"), old.get("version")) != (mapping.framework, mapping.version):
        raise UserError(f"--out {out}: not a calibration of {mapping.framework} {mapping.version} to merge --only into")
    return old


def _merged(old: dict, doc: dict, only: frozenset[str]) -> dict:
    """``old``'s calibration with its fits of the classes ``only`` replaced by ``doc``'s, the rest as they were."""
    def others(entries: dict) -> dict:
        return {k: v for k, v in entries.items() if k.split("/", 1)[0] not in only}

    merged = {k: v for k, v in old.items() if k != "rejected"}
    merged["fits"] = {**others(old.get("fits", {})), **doc["fits"]}
    rejected = {**others(old.get("rejected", {})), **doc.get("rejected", {})}
    return {**merged, "rejected": rejected} if rejected else merged


def _display(path: Path) -> str:
    """The database as the file names it: relative to the package for a shipped one."""
    parts = path.resolve().parts
    if "profiling" in parts and "data" in parts:
        i = parts.index("profiling")
        return "perfcast/data/profiling/" + "/".join(parts[i + 1:])
    return str(path)
