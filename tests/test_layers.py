"""The folder tree is the architecture: lower layers never import upper ones, and nothing
outside model capture imports torch."""

import ast
import subprocess
import sys
from pathlib import Path

import perfcast

ROOT = Path(perfcast.__file__).parent
# A package may import only packages of a strictly lower rank (and itself).
RANK = {"ir": 0, "inputs": 1, "dsl": 2, "hardware": 2, "models": 2, "data": 2, "perf": 3, "kernels": 3,
        "capture": 3, "rollup": 4, "db": 4, "engines": 4, "inference": 5, "serving": 6, "search": 7, "report": 8, "profiler": 6,
        "cli": 9}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_every_package_has_a_rank():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(RANK)


def test_lower_layers_never_import_upper_ones():
    violations = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).parts
        if len(rel) < 2:
            continue
        own = rel[0]
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] != "perfcast" or len(parts) < 2 or parts[1] == own:
                continue
            if RANK[parts[1]] >= RANK[own]:
                violations.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not violations, "\n".join(violations)


def test_core_modules_and_kernel_cli_never_import_torch():
    code = (
        "import sys, perfcast.ir, perfcast.dsl, perfcast.hardware, perfcast.perf, "
        "perfcast.rollup, perfcast.kernels, perfcast.report.kernel\n"
        "from perfcast.cli.main import main\n"
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['kernel', 'flash-attention', '--json']) == 0\n"
        "    assert main(['models', '--json']) == 0\n"
        "    assert main(['devices', '--json']) == 0\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_modules_stay_small_enough_to_read_in_one_sitting():
    # Style habit (STYLE.md §9, tinygrad's line budget): a module over 400 lines wants splitting.
    long = [f"{p.relative_to(ROOT)}: {n}" for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long, long
