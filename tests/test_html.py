"""``--html FILE`` (docs/design/report.md): one self-contained page per run of text-generate, serve,
optimize, validate and kernel — the JSON document the same run prints, the figures as PNG data URIs,
no reference to the network, every string escaped, the same bytes for the same document — loaded
in a real headless browser (Debian's ``chromium``): it draws, its script runs without an error, its
tables sort on a click and its JSON is ready to download."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from fuzzing import run_cli
from perfcast.report import html as report_html
from perfcast.report.format import seconds

#: a capture and pricing on a loaded CI machine (tests/test_plots.py)
SLOW_S = 600
#: one browser run at most (a cold start of chromium takes a few seconds)
BROWSER_S = 60
PNG = b"\x89PNG\r\n\x1a\n"

#: command → (argv, the figures its page shows) — the runs of tests/test_plots.py
RUNS = {
    "text-generate": (["text-generate", "llama-3.1-8b", "--decode", "--context-length", "1024", "--num-queries", "8"],
                      ["roofline", "step-time", "memory"]),
    "serve": (["serve", "llama-3.1-8b", "--request-rate", "6", "--num-requests", "60", "--isl", "uniform:200-600",
               "--osl", "16", "--ttft-slo", "0.5"], ["serve-timeline", "serve-latency"]),
    "optimize": (["optimize", "llama-3.1-8b", "--devices", "h100-sxm", "--total-devices", "2", "--batch-sizes", "2,8",
                  "--isl", "512", "--osl", "32", "--serving-mode", "both"], ["pareto"]),
    "validate": (["validate", "--population", "published-static", "--limit", "4"], ["validate"]),
    "kernel": (["kernel", "flash-attention", "--sweep", "B=1,8,64", "--sweep", "T_kv=4096,32768"],
               ["kernel-roofline", "kernel-sweep"]),
}


class Page(HTMLParser):
    """What a test reads of a page: every tag with its attributes, the text of the elements with
    an id, and the text of each ``<style>`` and ``<script>``."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: dict[str, str] = {}
        self.code: list[str] = []
        self._open: list[tuple[str, str | None]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag not in ("img", "meta", "br", "input"):
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for t, i in self._open:
            if i is not None:
                self.text[i] = self.text.get(i, "") + data
        if self._open and self._open[-1][0] in ("style", "script"):
            self.code.append(data)

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.tags if "id" in a}


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Each command run once with ``--html`` and ``--json``: its stdout, stderr and page."""
    out = {}
    for command, (argv, _) in RUNS.items():
        path = tmp_path_factory.mktemp("html") / f"{command}.html"
        rc, stdout, err = run_cli(*argv, "--json", "--html", str(path), timeout_s=SLOW_S)
        assert rc == 0, err
        out[command] = {"path": path, "out": stdout, "err": err, "text": path.read_text(encoding="utf-8")}
    return out


@pytest.fixture(params=list(RUNS))
def page(request, pages):
    return {"command": request.param, **pages[request.param]}


# --- the page -------------------------------------------------------------------------------------------

def test_stdout_stays_the_json_and_the_page_holds_it_byte_for_byte(page):
    doc = json.loads(page["out"])  # stdout holds the document alone: no "wrote" line
    assert page["err"] == ""
    embedded = Page(page["text"]).text["document"]
    assert embedded + "\n" == page["out"]  # what --json printed, the same run
    assert doc["schema_version"] == 1


def test_the_page_has_every_section(page):
    p = Page(page["text"])
    assert {"headline", "headline-figures", "inputs", "inputs-list", "command-line", "figures", "tables",
            "provenance", "missing", "notes", "json", "document", "download"} <= p.ids()
    argv = RUNS[page["command"]][0]
    assert p.text["command-line"].startswith("perfcast " + " ".join(argv))
    assert sum(1 for t, a in p.tags if t == "table" and "sortable" in a.get("class", "")) >= 1


def test_every_figure_is_a_png_data_uri(page):
    from PIL import Image

    p = Page(page["text"])
    images = {a["alt"].split(":")[0]: a["src"] for t, a in p.tags if t == "img"}
    assert list(images) == RUNS[page["command"]][1]
    for name, src in images.items():
        head, data = src.split(",", 1)
        assert head == "data:image/png;base64"
        png = base64.b64decode(data)
        assert png.startswith(PNG)
        with Image.open(io.BytesIO(png)) as im:
            assert im.size == (1000, 600)  # the --plot figure (tests/test_plots.py)


def test_nothing_is_fetched_from_a_network(page):
    p = Page(page["text"])
    assert not {t for t, _ in p.tags} & {"link", "iframe", "object", "embed", "base", "audio", "video", "source"}
    for tag, attrs in p.tags:
        for name in ("src", "href", "action", "poster", "srcset"):
            if name in attrs:
                assert attrs[name].startswith(("data:", "#")), (tag, name, attrs[name][:80])
    code = "".join(p.code)
    assert not re.search(r"https?:|//[a-z]|@import|url\(|fetch\(|XMLHttpRequest|import\(", code)
    # a network address may stand in the text (a source's URL), never in a tag that loads it
    assert not re.search(r"""<[^>]+\s(src|href|srcset|action)\s*=\s*["']?(https?:)?//""", page["text"], re.I)


def test_the_headline_says_what_the_document_says(pages):
    k = json.loads(pages["kernel"]["out"])
    text = Page(pages["kernel"]["text"]).text["headline-figures"]
    assert f"time{seconds(k['totals']['time_s'])}" in text
    o = json.loads(pages["optimize"]["out"])
    assert o["best"]["deployment"]["description"] in Page(pages["optimize"]["text"]).text["headline-figures"]
    t = json.loads(pages["text-generate"]["out"])
    step = seconds(t["performance_models"]["analytic"]["total_time_s"])
    assert f"step (analytic){step}" in Page(pages["text-generate"]["text"]).text["headline-figures"]
    # every op of the document is a row of the op table, in the document's order
    ops = re.search(r'<table class="sortable" id="ops">.*?</table>', pages["text-generate"]["text"]).group(0)
    assert re.findall(r'<tr data-i="\d+"><td[^>]*>([^<]*)</td>', ops) == [o["name"] for o in t["ops"]]


def test_every_string_is_escaped(pages):
    doc = json.loads(pages["kernel"]["out"])
    evil = '<script>alert("x")</script><img src=http://x/a.png>&'
    doc["kernel"], doc["notes"] = evil, [evil]
    doc["leaves"] = {evil: next(iter(doc["leaves"].values()))}
    text = report_html.page("kernel", doc, {}, ["kernel", evil])
    assert "<script>alert" not in text and "<img src=http" not in text
    assert text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 4  # title, notes, leaf, command line
    p = Page(text)
    assert json.loads(p.text["document"])["kernel"] == evil  # the JSON reads back whole


def test_the_same_document_gives_the_same_bytes(pages, tmp_path):
    doc = json.loads(pages["kernel"]["out"])
    assert report_html.page("kernel", doc, {}, ["kernel"]) == report_html.page("kernel", dict(doc), {}, ["kernel"])
    # a second run of the same command line, figures and all (the kernel's document holds no wall time)
    path = tmp_path / "kernel.html"
    texts = []
    for _ in range(2):
        rc, out, err = run_cli(*RUNS["kernel"][0], "--html", str(path))
        assert rc == 0 and out.endswith(f"wrote {path}\n"), err
        texts.append(path.read_bytes())
    assert texts[0] == texts[1]


def test_a_figure_not_drawn_and_a_step_that_does_not_fit_are_said(pages):
    from perfcast.report.plots import Skipped

    doc = json.loads(pages["serve"]["out"])
    p = Page(report_html.page("serve", doc, {"serve-latency": Skipped("serve-latency", "the run is overloaded")}))
    assert p.text["figures-skipped"] == "serve-latency: the run is overloaded" and "alert" not in p.ids()
    doc = json.loads(pages["text-generate"]["out"])
    doc["memory"] = {**doc["memory"], "fits": False, "free_bytes": 0, "shortfall_bytes": 2_500_000_000}
    p = Page(report_html.page("text-generate", doc))
    assert p.text["alert"].startswith("DOES NOT FIT: short by 2.5 GB of 85.52 GB.")
    assert "DOES NOT FIT (short by 2.5 GB)" in p.text["headline-figures"]


@pytest.mark.parametrize("command", list(RUNS))
def test_a_place_that_cannot_be_written_is_one_line_and_exit_2(command, tmp_path):
    argv = RUNS[command][0]
    for where, why in ((tmp_path / "no" / "such" / "page.html", "no such directory"),
                       (tmp_path, "is a directory")):
        rc, out, err = run_cli(*argv, "--html", str(where))
        assert rc == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"perfcast {command}: error: --html {where}: ") and why in err
    (tmp_path / "file").write_text("")
    rc, _, err = run_cli(*argv, "--html", str(tmp_path / "file" / "page.html"))
    assert rc == 2 and "not a directory" in err


# --- in a browser ---------------------------------------------------------------------------------------

def _install_chromium() -> str | None:
    """Debian's chromium: already installed, else installed with apt-get when this runs as root
    (at most 2 + 5 minutes, so a slow mirror costs the suite a skip, not its time budget)."""
    found = shutil.which("chromium")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=120)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """``chromium(*flags, url)``: (stdout, stderr) of one headless run."""
    exe = _install_chromium()
    if exe is None:
        pytest.skip("no chromium to load the pages in: install Debian's package (apt-get install chromium; as "
                    "root the tests install it themselves)")
    profile = tmp_path_factory.mktemp("chromium-profile")

    def run(*args: str) -> tuple[str, str]:
        proc = subprocess.run([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-extensions", f"--user-data-dir={profile}", "--hide-scrollbars",
                               "--host-resolver-rules=MAP * ~NOTFOUND", *args], capture_output=True, text=True,
                              timeout=BROWSER_S)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout, proc.stderr
    try:
        run("--version")
    except (OSError, AssertionError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"chromium at {exe} does not start headless here: {str(e)[:200]}")
    return run


#: the injected click: the first sortable table's first numeric column, once (ascending)
CLICK = """<script>
var t = document.querySelector("table.sortable");
var th = t.tHead.rows[0].querySelector("th.num");
th.click();
document.body.setAttribute("data-clicked", th.textContent);
</script>
</body>"""


def _console(stderr: str) -> list[str]:
    """The page's console messages in chromium's log (an uncaught error is one)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def test_the_browser_reports_a_script_error(chromium, tmp_path):
    # the check below would see nothing if chromium logged no console message at all
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    _, err = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", bad.as_uri())
    assert any("Uncaught ReferenceError" in line for line in _console(err))


def test_the_page_draws_in_a_browser(chromium, page, tmp_path):
    from PIL import Image, ImageStat

    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,2000", page["path"].as_uri())
    with Image.open(shot) as im:
        assert im.size == (1280, 2000)
        grey = im.convert("L")
        assert ImageStat.Stat(grey).stddev[0] > 20  # text, cards and a figure, not a blank page
        assert len(grey.getcolors(256) or ()) > 50


def test_the_script_runs_without_an_error_and_sorts_on_a_click(chromium, page, tmp_path):
    clicked = tmp_path / "clicked.html"
    clicked.write_text(page["text"].replace("</body>", CLICK), encoding="utf-8")
    dom, err = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", clicked.as_uri())
    assert _console(err) == []
    tables = page["text"].count('<table class="sortable"')
    assert f'data-sortable="{tables}"' in dom  # the script ran to its end and found every table
    assert 'id="download"' in dom and 'data-ready="true"' in dom and 'href="blob:' in dom
    # the first sortable table is now in ascending order of the clicked column, blanks last
    table = re.search(r'<table class="sortable".*?</table>', dom, re.S).group(0)
    header = re.findall(r"<th[^>]*>(.*?)</th>", table)
    col = header.index(re.search(r'data-clicked="([^"]*)"', dom).group(1))
    assert 'aria-sort="ascending"' in table
    cells = [re.findall(r"<td([^>]*)>", row)[col] for row in re.findall(r"<tr data-i=.*?</tr>", table, re.S)]
    keys = [re.search(r'data-v="([^"]*)"', c).group(1) for c in cells]
    numbers = [float(k) for k in keys if k != ""]
    assert numbers == sorted(numbers) and keys[len(numbers):] == [""] * (len(keys) - len(numbers))
