"""The README's picture is what ``make picture`` draws now: the demo search's Pareto front, byte
for byte (a change to the search or the figure that moves it fails here until it is redrawn)."""

import re
import shlex
from pathlib import Path

from fuzzing import run_cli

ROOT = Path(__file__).resolve().parent.parent


def _recipe(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    body = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    (line,) = [ln for ln in body.splitlines() if "perfcast " in ln]
    return shlex.split(line.strip())[1:]


def test_the_readme_shows_the_picture_make_picture_draws(tmp_path):
    argv = _recipe("picture")
    demo = _recipe("demo")
    i = argv.index("--plot")
    assert argv[:i] == demo and argv[i + 1] == "docs/images/quickstart"   # the demo's search, drawn
    assert "![" in (ROOT / "README.md").read_text() and "(docs/images/quickstart/pareto.png)" in \
        (ROOT / "README.md").read_text()
    rc, _, err = run_cli(*argv[:i], "--plot", str(tmp_path), timeout_s=600)
    assert rc == 0, err
    for name in ("pareto.png", "pareto.svg"):
        assert (tmp_path / name).read_bytes() == (ROOT / "docs/images/quickstart" / name).read_bytes(), \
            f"docs/images/quickstart/{name} is stale: run `make picture`"
