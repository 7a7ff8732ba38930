"""``perfcast validate``: measured end-to-end serving runs through perfcast, per population, next
to a naive datasheet roofline of the same steps (docs/design/validation.md)."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import add_report_arguments, count, refuse, report_files, report_paths
from perfcast.ir import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="compare perfcast with measured serving runs (TPOT per population)",
                       description="Map every row of aiconfigurator-core's silicon_sample.csv (a copy ships with "
                                   "perfcast) and of the published tables to perfcast steps, price them, and print "
                                   "per population the median and p90 |error| of TPOT, its signed median and the "
                                   "coverage, next to a naive datasheet roofline.")
    p.add_argument("--silicon-sample", metavar="PATH",
                   help="a silicon_sample.csv to read instead of the shipped copy; 'aiconfigurator' reads the "
                        "one of an installed aiconfigurator-core")
    p.add_argument("--published", metavar="PATH", help="a published-measurements YAML instead of the shipped one")
    p.add_argument("--system", action="append", default=[], metavar="NAME",
                   help="only these systems (h100_sxm or the device h100-sxm); repeatable")
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="only these models (model_path, or the catalog model e.g. deepseek-v3); repeatable")
    p.add_argument("--backend", action="append", default=[], metavar="NAME", help="only trtllm, vllm or sglang rows")
    p.add_argument("--mode", action="append", default=[], choices=("agg", "disagg", "static"),
                   help="only agg, disagg or static (a published static batch) rows")
    p.add_argument("--population", metavar="NAME",
                   help="only one named population: llama-3.1-8b-h100-trtllm, stratified, published or "
                        "published-static")
    p.add_argument("--subset", metavar="NAME", help="ci: the fast subset CI runs (see docs/design/validation.md)")
    p.add_argument("--limit", type=count(), metavar="N", help="at most N rows (in file order, after the filters)")
    p.add_argument("--seed", type=count(0), default=0, help="seed of the stratified sample (default 0)")
    p.add_argument("--performance-model", action="append", metavar="NAME",
                   help="analytic (default) or profiling; repeatable, reported side by side")
    p.add_argument("--no-baseline", action="store_true", help="skip the datasheet roofline baseline")
    p.add_argument("--strict", action="store_true",
                   help="refuse rows whose quantization perfcast prices only approximately (int4_wo: no group size stated)")
    p.add_argument("--serving", action="store_true",
                   help="also replay every aggregated row with `perfcast serve` at its concurrency (TPOT and TTFT "
                        "under load; seconds per distinct deployment)")
    p.add_argument("--jobs", type=count(1, 1024), metavar="N",
                   help="processes for the --serving replay (default: the CPUs available)")
    p.add_argument("--rows", metavar="FILE", help="write one line per row (.csv, or .json) with its mapping and predictions")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_report_arguments(p)
    p.set_defaults(run=run)


def _silicon_sample(value: str | None) -> str | None:
    if value != "aiconfigurator":
        return value
    from perfcast.db.aiconfigurator import default_root

    root = default_root()
    if root is None:
        raise UserError("--silicon-sample aiconfigurator: aiconfigurator-core is not installed "
                        "(pip install aiconfigurator-core, or pass a path)")
    return str(root / "systems" / "silicon_sample.csv")


def run(args) -> int:
    from perfcast.inference.steps import BASELINE
    from perfcast.inference.textgen import PERFORMANCE_MODELS
    from perfcast.inference.validation import ValidationRequest
    from perfcast.serving.validation import run as validate
    from perfcast.report import validation as report
    from perfcast.report.document import check, emit

    models = tuple(dict.fromkeys(args.performance_model or ("analytic",)))
    choices = tuple(m for m in PERFORMANCE_MODELS if m != BASELINE)  # the baseline is in every report
    for m in models:
        if m == BASELINE:
            raise UserError(f"--performance-model {m}: the naive datasheet roofline is the baseline every "
                            f"validation prints already; expected one of {', '.join(choices)}")
        if m not in PERFORMANCE_MODELS:
            raise UserError(f"--performance-model {m!r}: expected one of {', '.join(choices)}")
    refuse(args, ("--seed", args.population in (None, "stratified"),
                  f"draws the stratified sample; --population {args.population} is not drawn"),
           ("--jobs", args.serving, "sets the processes of the serving replay; add --serving"))
    if args.rows and not args.rows.endswith((".csv", ".json")):
        raise UserError(f"--rows {args.rows}: expected a .csv or .json file name")
    report_paths(args)
    req = ValidationRequest(silicon_sample=_silicon_sample(args.silicon_sample), published=args.published,
                            systems=tuple(args.system), models=tuple(args.model), backends=tuple(args.backend),
                            modes=tuple(args.mode), population=args.population, subset=args.subset,
                            limit=args.limit, seed=args.seed, performance_models=models,
                            baseline=not args.no_baseline, strict=args.strict)
    from perfcast.cli.progress import progress

    label = "validating: pricing the rows" + (", then replaying them with perfcast serve" if args.serving else "")
    with progress(args, label) as bar:
        doc = validate(req, serving=args.serving, progress=bar, jobs=args.jobs)
    if args.rows:
        try:
            report.write_rows(doc, args.rows)
        except OSError as e:
            raise UserError(f"--rows {args.rows}: cannot write ({e.strerror})") from None
    summary = check(report.to_json(doc))  # the tables and figures below are drawn from the same figures
    wrote = []
    if args.plot or args.html:
        from perfcast.report import plots_validation

        wrote = report_files(args, summary, plots_validation.validate, doc)
    if args.json:
        return emit(summary)
    console = Console(width=max(160, Console().width))
    report.render(console, doc)
    for line in wrote:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0
