import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis import settings

# Sympy's first call of a kind can be slow (caches); deadlines would make tests flaky. The
# default profile is derandomized: CI runs the same generated cases every time, so a red run
# is a change's doing, never the draw's. `pytest --hypothesis-profile=explore` draws new cases
# (with `--hypothesis-seed=N` to replay a draw) to look for what the fixed draw misses.
settings.register_profile("perfcast", deadline=None, derandomize=True, database=None)
settings.register_profile("explore", deadline=None, derandomize=False, database=None)
settings.load_profile("perfcast")


@pytest.fixture
def cli():
    """Run ``perfcast ARGS`` in a fresh interpreter; returns the CompletedProcess."""

    def run(*args: str, check: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "perfcast.cli.main", *args],
                              capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(proc.stderr)
        return proc

    return run


def pytest_configure(config):
    # The capture cache of the test run lives in a fresh folder (subprocesses inherit it): tests
    # neither depend on nor pollute the user's ~/.cache/perfcast.
    # Under pytest-xdist the workers share the controller's folder (they inherit its environment):
    # one capture serves them all; entries are written atomically, so two writers cannot tear one.
    if "PERFCAST_TEST_CACHE" not in os.environ:
        os.environ["PERFCAST_TEST_CACHE"] = tempfile.mkdtemp(prefix="perfcast-test-cache-")
    os.environ["XDG_CACHE_HOME"] = os.environ["PERFCAST_TEST_CACHE"]
