"""perfcast.capture.hf_imports: the capture's transformers imports, quicker and changing nothing a
capture uses. Each case runs in a new process (the workarounds act on the first import only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

_REPORT = """
import json, sys
m = sys.modules["transformers.models"]
import transformers.utils, transformers.utils.import_utils as iu
print(json.dumps({
    "structure": sorted(f"{mod}:{sorted(names)}" for mod, names in m._import_structure.items()),
    "classes": len(m._class_to_module), "misses": iu.create_import_structure_from_path.cache_info().misses,
    "scipy_check": transformers.utils.is_scipy_available(), "iu_scipy_check": iu.is_scipy_available(),
    "optimize": "scipy.optimize" in sys.modules, "modeling": "transformers.modeling_utils" in sys.modules}))
"""


def _run(prelude: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", prelude + _REPORT], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout)


def test_the_model_folders_are_scanned_once_into_the_same_lazy_structure():
    plain = _run("import transformers.models\n")
    ours = _run("from perfcast.capture import hf_imports\nhf_imports.models()\n")
    assert ours["structure"] == plain["structure"] and ours["classes"] == plain["classes"] > 1000
    # transformers' own 128-entry cache lets the second scan miss every folder: about twice as many
    assert plain["misses"] > 1.8 * ours["misses"]


def test_modeling_utils_comes_without_scipy_optimize_and_the_check_is_restored():
    plain = _run("import transformers.modeling_utils\n")
    ours = _run("from perfcast.capture import hf_imports\nhf_imports.modeling_utils()\n")
    assert plain["optimize"] and not ours["optimize"] and ours["modeling"]
    assert ours["scipy_check"] is ours["iu_scipy_check"] is plain["scipy_check"] is True
    assert ours["structure"] == plain["structure"]


def test_the_last_all_reader_returns_what_transformers_reads_for_every_file():
    import transformers.utils.import_utils as iu

    from perfcast.capture.hf_imports import last_all

    fast = last_all(iu.fetch__all__)
    root = Path(iu.__file__).resolve().parent.parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 2000
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert fast(text) == iu.fetch__all__(text), path
    # the lines it may skip: other breaks go to the original whole, and no __all__ line gives nothing
    for text in ("x = 1\r__all__ = ['a']\n", "__all__ = ['a', 'b']\n", "y = '__all__'\n", "__all__ = [\n  'a',\n]\n"):
        assert fast(text) == iu.fetch__all__(text)


def test_a_published_configs_transformers_warnings_are_kept_off_stderr_and_logged_at_debug():
    # Llama 4 Scout ships rope_scaling with high_freq_factor == low_freq_factor == 1.0, which
    # transformers' rope check warns about on every config it builds
    code = ("import logging, sys\n"
            "from perfcast.models.catalog import load_model_config\n"
            "from perfcast.capture.build import hf_config\n"
            "hf_config(load_model_config('llama-4-scout'))\n"
            "sys.stderr.write('--\\n')\n"
            "logging.basicConfig(level=logging.DEBUG, format='%(name)s %(message)s')\n"
            "hf_config(load_model_config('llama-4-scout'))\n"
            "sys.stderr.write('--\\n')\n"
            "import transformers.models.llama4.configuration_llama4 as c\n"
            "c.logger.warning('still shown')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stderr
    quiet, debug, after = err.split("--\n")
    assert quiet == ""
    assert "perfcast.capture.hf_imports " in debug and "llama-4-scout" in debug and "high_freq_factor" in debug
    assert "[transformers]" not in debug
    assert "still shown" in after   # transformers' own handler is back once the config is built
