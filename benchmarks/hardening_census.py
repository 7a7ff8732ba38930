"""Benchmark: the hardening census — how perfcast answers hostile and malformed input.

About 800 generated cases (``benchmarks/census_cases.py``, deterministic from ``--seed``) in five
populations: mutated model configs (``text-generate``, ``explain``), device and topology YAMLs
(``devices``/``topologies`` and a cheap pricing on the file), profiling databases (``db check``,
``op … --performance-model profiling``) and flag values (``collective``, ``kernel``, ``op``,
``text-generate``, ``explain``). Each case is a command line and the files it reads, run in a
process of its own against the checkout whose ``src`` is ``--src`` — the same cases for any
checkout, so two runs compare before and after. Each answer is classified:

- **answered**: exit 2 with an error line on stderr (a report of several problems: a line each,
  at most 40), or exit 0 with plausible figures;
- **traceback**: a Python traceback, or an exit code other than 0 and 2 (a crash, a kill);
- **hung**: no answer within ``--timeout`` seconds;
- **absurd**: exit 0 with a NaN, an infinity or a negative time, size or memory in the output, a
  priced time that can only come from a table outside the database, a YAML tag that ran code —
  or exit 0 on a case that must be refused (the case says so: the H200 database priced on
  h100-sxm, ``num_experts: 0``, ``--link-latency -1``, ``1:30`` as a capacity): silently wrong;
- **flood**: a line of more than 400 characters on stderr, or more than 40 lines;
- **mute**: exit 2 without an error line on stderr (nothing, or the error on stdout).

Cases run in two workers (``--workers``). By default a worker is a warm interpreter that has
imported the checkout's perfcast, torch and transformers, and forks a child per case that runs
``perfcast.cli.main`` as ``python -m`` does (argv, ``__main__``, its own folder, stdout and
stderr, exit code, a memory limit); ``--spawn`` starts ``python -m perfcast.cli.main`` afresh
per case instead, which is the same answer at several times the cost (the imports, paid per case).
Every case has a fresh folder as its working directory and capture cache.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/hardening_census.py [--src DIR] [--json]
[--show N]``); one to four minutes per checkout on two busy cores (a checkout that hangs or
captures more pays more), ``--spawn`` about three times that.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from census_cases import DIR, POPULATIONS, Case, generate  # noqa: E402

# the verdict on a result is the fuzzing harness's (tests/fuzzing.py): the same promise, one checker
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fuzzing import figure_problems, json_documents  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("answered", "traceback", "hung", "absurd", "flood", "mute")
MAX_LINE_CHARS, MAX_ERROR_LINES = 400, 40
#: what a case's own process may map: the warm interpreter's size plus this
MEMORY_HEADROOM = 3 * 2**30
#: imported by a warm worker before it forks (a module missing from a checkout is skipped)
PRELOAD = ["perfcast.cli.main", "perfcast.cli.textgen", "perfcast.cli.kernel", "perfcast.cli.op",
           "perfcast.cli.collective", "perfcast.cli.db", "perfcast.cli.devices", "perfcast.capture.build",
           "torch", "transformers", "sympy", "pandas", "transformers.models.llama.modeling_llama",
           "transformers.models.qwen3_moe.modeling_qwen3_moe"]

# A warm worker: reads a case per line on its stdin (JSON), forks a child that runs perfcast as
# `python -m perfcast.cli.main ARGV` would, answers a line (exit code, seconds) when it is done.
WORKER = r"""
import importlib, json, os, resource, runpy, signal, sys, time, traceback
requests = os.fdopen(os.dup(0), "r")
answers = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
# `python -m perfcast.cli.main` runs the module as __main__ without importing it first: so must a child
sys.modules.pop("perfcast.cli.main", None)
if "perfcast.cli" in sys.modules and hasattr(sys.modules["perfcast.cli"], "main"):
    delattr(sys.modules["perfcast.cli"], "main")
size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
limit = size + int(sys.argv[2])
answers.write(json.dumps({"ready": True}) + "\n")
answers.flush()
for line in requests:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            os.chdir(req["cwd"])
            os.environ.update(req["env"])
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            sys.argv = ["perfcast", *req["argv"]]
            try:
                runpy.run_module("perfcast.cli.main", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            os._exit(code)
    rc = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - start > req["timeout"]:
            # the child's group and what it started; the child alone if it has not made its group yet
            for kill, target in ((os.killpg, pid), (os.kill, pid)):
                try:
                    kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    answers.write(json.dumps({"rc": rc, "seconds": time.monotonic() - start}) + "\n")
    answers.flush()
"""


def _environment(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFCAST", "XDG_CACHE"))}
    env.update(PYTHONPATH=str(src), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0")
    return env


class WarmWorker:
    """A warm interpreter of the checkout, forking a child per case."""

    def __init__(self, src: Path):
        self.src = src
        self.proc = None

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(PRELOAD), str(MEMORY_HEADROOM)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=_environment(self.src), cwd=tempfile.gettempdir())
        assert json.loads(self.proc.stdout.readline())["ready"]

    def run(self, argv: list[str], cwd: Path, timeout: float) -> tuple[int | None, float]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        req = {"argv": argv, "cwd": str(cwd), "env": {"XDG_CACHE_HOME": str(cwd / ".cache")}, "timeout": timeout}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return answer["rc"], answer["seconds"]

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


class SpawnWorker:
    """``python -m perfcast.cli.main ARGV`` per case."""

    def __init__(self, src: Path):
        self.env = _environment(src)

    def run(self, argv: list[str], cwd: Path, timeout: float) -> tuple[int | None, float]:
        import resource
        import signal

        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (2 * MEMORY_HEADROOM, 2 * MEMORY_HEADROOM))

        start = time.monotonic()
        with open(cwd / "stdout", "wb") as out, open(cwd / "stderr", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "perfcast.cli.main", *argv], cwd=cwd, stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=limit,
                                    env={**self.env, "XDG_CACHE_HOME": str(cwd / ".cache")})
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        return rc, time.monotonic() - start

    def close(self):
        pass


# --- the verdict --------------------------------------------------------------------------------

def _times(doc) -> list[float]:
    """Every ``time_s`` in a document."""
    if isinstance(doc, dict):
        return [v for k, v in doc.items() if k == "time_s" and isinstance(v, (int, float))] + \
            [t for v in doc.values() for t in _times(v)]
    if isinstance(doc, list):
        return [t for v in doc for t in _times(v)]
    return []


def classify(case: Case, rc: int | None, out: str, err: str, ran_code: bool) -> tuple[str, str]:
    """(class, why) of one answer."""
    lines = err.splitlines()
    last = lines[-1][:200] if lines else ""
    if rc is None:
        return "hung", "no answer in time"
    if "Traceback (most recent call last)" in err:
        return "traceback", last
    if rc not in (0, 2):
        return "traceback", f"exit {rc}: {last}"
    longest = max((len(line) for line in lines), default=0)
    if longest > MAX_LINE_CHARS or len(lines) > MAX_ERROR_LINES:
        return "flood", f"{len(lines)} lines on stderr, the longest {longest:,} characters"
    if ran_code:
        return "absurd", "a YAML tag ran code (the file PWNED was written)"
    if rc == 2:
        if lines and "error" in lines[0]:
            return "answered", lines[0][:200]
        return "mute", f"exit 2, stdout: {out.strip()[:150]!r}" if out.strip() else "exit 2 and not a word"
    try:
        docs = json_documents(out)
    except json.JSONDecodeError as e:
        return "absurd", f"--json printed what is not JSON ({e})"
    for doc in docs:
        bad = figure_problems(doc)
        if bad:
            return "absurd", "; ".join(bad[:3])
    if not docs and re.search(r"(?<![\w.])(nan|-?inf|-?infinity)(?![\w.])", out, re.I):
        return "absurd", "a non-finite figure printed"
    if case.outside_s is not None and any(math.isclose(t, case.outside_s) for d in docs for t in _times(d)):
        return "absurd", "priced from the table outside the database"
    if case.must_refuse:
        return "absurd", "exit 0 on a case that must be refused"
    return "answered", "exit 0"


# --- running ------------------------------------------------------------------------------------

def _materialize(case: Case, folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    for path, content in case.files:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    for path, dest in case.links:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(dest)
    return [a.replace(DIR, str(folder)) for a in case.argv]


def run_all(cases: list[Case], src: Path, workers: int, timeout: float, spawn: bool, keep: Path | None,
            progress) -> list[dict]:
    scratch = Path(tempfile.mkdtemp(prefix="perfcast-census-", dir=keep))
    local = threading.local()
    made = []
    lock = threading.Lock()

    def worker():
        if not hasattr(local, "worker"):
            local.worker = (SpawnWorker if spawn else WarmWorker)(src)
            with lock:
                made.append(local.worker)
        return local.worker

    def one(i: int) -> dict:
        case = cases[i]
        folder = scratch / f"case{i:04d}"
        argv = _materialize(case, folder)
        rc, seconds = worker().run(argv, folder, timeout)
        out = (folder / "stdout").read_text(errors="replace") if (folder / "stdout").exists() else ""
        err = (folder / "stderr").read_text(errors="replace") if (folder / "stderr").exists() else ""
        verdict, why = classify(case, rc, out, err, (folder / "PWNED").exists())
        # the case's folder as the command line shows it: answers compare across runs
        why, err = why.replace(str(folder), DIR), err.replace(str(folder), DIR)
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
        return {"index": i, "population": case.population, "kind": case.kind, "must_refuse": case.must_refuse,
                "argv": list(case.argv), "class": verdict, "why": why, "rc": rc, "seconds": round(seconds, 3),
                "stderr_head": "\n".join(err.splitlines()[:3])[:600]}

    results: list[dict | None] = [None] * len(cases)
    try:
        with ThreadPoolExecutor(workers) as pool:
            for future in as_completed([pool.submit(one, i) for i in range(len(cases))]):
                r = future.result()
                results[r["index"]] = r
                progress(r)
    finally:
        for w in made:
            w.close()
        if keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def _commit(src: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True).stdout.strip()
        return rev + ("+changes" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def tally(results: list[dict]) -> dict[str, dict[str, int]]:
    table: dict[str, collections.Counter] = {}
    for r in results:
        table.setdefault(r["population"], collections.Counter())[r["class"]] += 1
    table["total"] = sum(table.values(), collections.Counter())
    return {pop: {"cases": sum(c.values()), **{k: c.get(k, 0) for k in CLASSES}} for pop, c in table.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=ROOT / "src", help="the checkout's src folder (default: this one's)")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    p.add_argument("--population", action="append", choices=list(POPULATIONS), help="only these (repeatable)")
    p.add_argument("--match", action="append", metavar="TEXT",
                   help="only the cases whose mutation names TEXT, e.g. 'alias bomb' (repeatable: any)")
    p.add_argument("--limit", type=int, help="only the first N cases of each population")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as hung (default 20)")
    p.add_argument("--spawn", action="store_true", help="a fresh `python -m perfcast.cli.main` per case")
    p.add_argument("--json", action="store_true", help="print the census as JSON (every case's answer included)")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print N failures of each class")
    p.add_argument("--keep", type=Path, help="keep the cases' folders (files, stdout, stderr) under this folder")
    args = p.parse_args(argv)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console(stderr=args.json)
    cases = generate(args.seed, args.population)
    if args.match:
        cases = [c for c in cases if any(text in c.kind for text in args.match)]
    if args.limit:
        first = collections.defaultdict(list)
        for c in cases:
            first[c.population].append(c)
        cases = [c for group in first.values() for c in group[:args.limit]]
    digest = hashlib.sha256("\n".join(c.key() for c in cases).encode()).hexdigest()[:16]
    src = args.src.resolve()
    start = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"census of {src}", total=len(cases))
        failed = collections.Counter()

        def progress(r):
            if r["class"] != "answered":
                failed[r["class"]] += 1
            bar.update(task, advance=1, description=f"census ({', '.join(f'{k} {v}' for k, v in failed.items())})")

        results = run_all(cases, src, args.workers, args.timeout, args.spawn, args.keep, progress)
    wall = time.monotonic() - start
    counts = tally(results)
    meta = {"src": str(src), "commit": _commit(src), "seed": args.seed, "cases": len(cases), "digest": digest,
            "mode": "spawn" if args.spawn else "fork", "timeout_s": args.timeout, "wall_s": round(wall, 1)}
    failures = [r for r in results if r["class"] != "answered"]
    if args.json:
        print(json.dumps({**meta, "counts": counts, "failures": failures, "results": results}, indent=1))
        return 0
    table = Table(title=f"hardening census of {meta['commit']} ({src}), seed {args.seed}, {len(cases)} cases "
                        f"(digest {digest}), {wall:.0f} s")
    for col in ("population", "cases", *CLASSES):
        table.add_column(col, justify="left" if col == "population" else "right")
    for pop, c in counts.items():
        table.add_row(pop, *(str(c[k]) for k in ("cases", *CLASSES)), style="bold" if pop == "total" else None)
    console.print(table)
    console.print("absurd = exit 0 with a non-finite or negative figure, or on a case that must be refused "
                  "(silently wrong); mute = exit 2 without an error line on stderr")
    if args.show and failures:
        console.print(f"\n{DIR} stands for a case's folder (--keep DIR keeps them, with each case's files, stdout "
                      "and stderr)", markup=False, highlight=False)
        for cls in CLASSES[1:]:
            shown = [r for r in failures if r["class"] == cls][:args.show]
            if shown:
                console.print(f"\n[bold]{cls}[/bold] ({sum(r['class'] == cls for r in failures)}):")
            for r in shown:
                console.print(f"  [{r['population']}] {r['kind']}", markup=False, highlight=False)
                console.print(f"    perfcast {shlex.join(r['argv'])}", markup=False, highlight=False)
                console.print(f"    {r['why']}", markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
