"""``perfcast engines``: the shipped engine profiles (or one profile file), their launch modes,
databases and rewrite rules with the sources each was read from."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.engines.spec import EngineProfile, engine_names, get_engine, load_profile_file, profiles_dir
from perfcast.hardware import device_names, get_device
from perfcast.report.document import check, emit


def add_parser(sub) -> None:
    p = sub.add_parser("engines", help="list the serving-engine profiles",
                       description="List the shipped serving-engine profiles (what --engine accepts), or "
                                   "show one profile's rules and their sources.")
    p.add_argument("name", nargs="?", help="show this engine's rules, in the order they apply")
    p.add_argument("--engine-file", metavar="PATH", help="validate and show this profile YAML file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _defaults() -> dict[str, list[str]]:
    """Engine name -> the shipped devices that default to it."""
    out: dict[str, list[str]] = {}
    for n in device_names():
        d = get_device(n).spec.default_engine
        if d is not None:
            out.setdefault(d.name, []).append(n)
    return out


def _launch(mode) -> str:
    limit = f" ≤ {mode.max_tokens} tokens" if mode.max_tokens else ""
    by_device = "".join(f", {d} ≤ {t}" for d, t in mode.max_tokens_by_device.items())
    return mode.mode.replace("_", " ") + limit + by_device


def _row(p: EngineProfile, path: str, defaults: dict[str, list[str]]) -> dict:
    return {
        "name": p.name,
        "framework": p.framework,
        "version": p.version,
        "description": p.description,
        "vendors": list(p.vendors),
        "database": p.database.model_dump() if p.database else None,
        "launch": {ph: _launch(getattr(p.launch, ph)) for ph in ("prefill", "decode")},
        "host_launch_interval_s": {v: h.value_s for v, h in p.launch.host_launch_interval_s.items()},
        "rule_count": len(p.rules),
        "default_on": defaults.get(p.name, []),
        "file": path,
    }


def _rule_line(r) -> tuple[str, str, str]:
    """(rule, what it matches, the kernel it makes)."""
    d = r.model_dump(exclude={"sources", "rule"}, exclude_defaults=True)
    where = [f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in d.items()
             if k in ("phases", "devices", "attention")]
    where += [f"{k}={v}" for k, v in r.option.items()]
    if r.rule == "attention":
        kernel = ", ".join(f"{k} {v}" for k, v in r.kernel.model_dump(exclude_none=True).items())
        what = "cache write: " + ", ".join(f"{ph} {c.mode}" for ph, c in r.cache_write.items())
    elif r.rule == "allreduce":
        kernel = ", ".join(dict.fromkeys(s.kernel for s in r.strategies))
        what = f"epilogue {'+'.join(r.epilogue.roles)} → {r.epilogue.kernel}" if r.epilogue else "no epilogue"
    elif r.rule == "merge_gemms":
        kernel, what = r.kernel, f"{r.region} GEMMs on one input"
    elif r.rule == "moe_a2a":
        kernel = f"{r.dispatch} ({r.dispatch_dtype}), {r.combine} ({r.combine_dtype})"
        what = f"MoE dispatch/combine all-to-alls, priced by {r.op}"
    elif r.rule == "aux_stream":
        kernel = f"(second stream, {' or '.join(r.launch)} launches)"
        what = f"{'/'.join(r.modules)} alongside {'+'.join(r.alongside)}"
    else:
        what = "+".join(r.roles)
        if r.rule == "absorb":
            kernel, what = r.kernel or "(the absorbing op's)", what + f" into {r.into} ({r.side})"
        elif r.rule == "drop":
            kernel = f"— ({r.why})"
        elif r.rule == "norm":
            kernel = r.kernel + (f"; after a residual add {r.with_residual}" if r.with_residual else "")
            what += "; across layers" if r.across_layers else ""
        else:
            kernel = r.kernel
    return r.rule, "; ".join([what] + where), kernel


def _show(p: EngineProfile, path: str, as_json: bool) -> int:
    doc = p.model_dump(mode="json") | {"file": path}
    if as_json:
        return emit(doc)
    check(doc)
    console = Console(width=max(160, Console().width))
    console.print(f"[bold]{p.name}[/]: {p.framework} {p.version} — {p.description}")
    db = f"{p.database.framework} {p.database.version}" if p.database else "none (analytic only)"
    console.print(f"vendors {', '.join(p.vendors)}; profiling database {db}; launch: prefill "
                  f"{_launch(p.launch.prefill)}, decode {_launch(p.launch.decode)}")
    for vendor, h in p.launch.host_launch_interval_s.items():
        console.print(f"host per eager kernel, {vendor}: {h.value_s * 1e6:g} µs — {h.source}")
    t = Table(title=f"{p.name} rules (applied in this order; ops no rule claims: {p.leftover.memory})")
    for col in ("#", "rule", "matches", "kernel", "source"):
        t.add_column(col, overflow="fold")
    for i, r in enumerate(p.rules):
        rule, what, kernel = _rule_line(r)
        t.add_row(str(i), rule, what, kernel, r.sources[0] + (f" (+{len(r.sources) - 1} more)" if len(r.sources) > 1 else ""))
    console.print(t)
    if p.scheduler is not None:
        sc = Table(title=f"{p.name} scheduler ({p.scheduler.policy}; perfcast serve's defaults)")
        for col in ("setting", "value", "source"):
            sc.add_column(col, overflow="fold")
        for name, setting in p.scheduler:
            if hasattr(setting, "value") and hasattr(setting, "sources"):
                sc.add_row(name, str(setting.value), setting.sources[0])
            elif hasattr(setting, "sources"):   # a group of values (SGLang's new_token_ratio, TRT-LLM's batch_wait)
                sc.add_row(name, ", ".join(f"{k} {v:g}" for k, v in setting if k != "sources"), setting.sources[0])
        console.print(sc)
    if p.moe_exchange is not None:
        x = p.moe_exchange
        where = f"; all-to-all on {', '.join(x.all_to_all_devices)}" if x.all_to_all_devices else ""
        where += "".join(f"; {name}={v}: {m}" for name, values in x.by_option.items() for v, m in values.items())
        console.print(f"MoE token exchange under attention DP: {x.default}{where} — {x.sources[0]}", markup=False)
    if p.options:
        ot = Table(title=f"{p.name} options (--engine-option NAME=VALUE; rules marked NAME=VALUE apply under it)")
        for col in ("option", "default", "choices", "engine setting", "source"):
            ot.add_column(col, overflow="fold")
        for name, o in p.options.items():
            only = "".join(f"; {c} on {', '.join(d)}" for c, d in o.devices.items())
            ot.add_row(name, o.value, ", ".join(o.choices) + only, o.setting, o.sources[0])
        console.print(ot)
    return 0


def run(args) -> int:
    from perfcast.inputs import excerpt
    from perfcast.ir import UserError

    if args.engine_file and args.name:
        raise UserError(f"--engine-file: give a profile file or a shipped engine's name ({excerpt(args.name)}), "
                        f"not both")
    if args.engine_file or args.name:
        if args.engine_file:
            p, path = load_profile_file(args.engine_file), args.engine_file
        else:
            p = get_engine(args.name)
            path = str(profiles_dir() / f"{p.name}.yaml")
        return _show(p, path, args.json)
    defaults = _defaults()
    rows = [_row(get_engine(n), str(profiles_dir() / f"{n}.yaml"), defaults) for n in engine_names()]
    if args.json:
        return emit({"engines": rows})
    check(rows)
    t = Table(title="Engines (perfcast engines NAME shows one profile's rules and sources)")
    for col in ("name", "framework", "vendors", "database", "prefill launch", "decode launch",
                "host per eager kernel", "rules", "default on"):
        t.add_column(col, overflow="fold")
    for r in rows:
        db = r["database"]
        host = ", ".join(f"{v} {h * 1e6:g} µs" for v, h in r["host_launch_interval_s"].items()) or "—"
        t.add_row(r["name"], f"{r['framework']} {r['version']}", ", ".join(r["vendors"]),
                  f"{db['framework']} {db['version']}" if db else "—", r["launch"]["prefill"],
                  r["launch"]["decode"], host, str(r["rule_count"]), ", ".join(r["default_on"]) or "—")
    Console(width=max(160, Console().width)).print(t)
    return 0
