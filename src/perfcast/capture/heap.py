"""The cyclic garbage collector during a process's first capture.

The first capture in a process imports torch, torch._dynamo and transformers and builds and
traces a model: some millions of objects, nearly all of them modules, classes and functions that
live until the process exits. The collector's full passes over that growing heap find next to
nothing, and in a cold ``perfcast text-generate`` they cost about as much as the capture's own
work. So the collector is paused for that capture, and what it leaves is then frozen
(:func:`gc.freeze`: moved where later passes do not scan it) rather than scanned once more.
Reference counting still frees everything acyclic as usual; a later capture in the same process
(torch already imported) runs with the collector as it is.
"""

from __future__ import annotations

import contextlib
import gc
import sys


@contextlib.contextmanager
def first_capture():
    if "torch" in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
