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

    with progress(args, f"calibrating {device.name}", lines=True) as bar:
        doc = calibrate(args.database, device, _display(args.database), progress=bar.log)
    if not doc["fits"]:
        raise UserError(f"{args.database}: no kernel table the calibration covers has enough rows")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# perfcast kernel calibration: {device.name}, {doc['framework']} {doc['version']}.\n"
              f"# Written by `perfcast calibrate`; do not edit by hand (see docs/design/pricing.md).\n")
    try:
        args.out.write_text(header + dump_yaml(doc, sort_keys=False, width=120))
    except OSError as e:
        raise UserError(f"--out {args.out}: cannot write ({e.strerror})") from None
    print(f"wrote {args.out}: {len(doc['fits'])} fits")
    return 0


def _display(path: Path) -> str:
    """The database as the file names it: relative to the package for a shipped one."""
    parts = path.resolve().parts
    if "profiling" in parts and "data" in parts:
        i = parts.index("profiling")
        return "perfcast/data/profiling/" + "/".join(parts[i + 1:])
    return str(path)
