"""Eager steps in serving: a step the engine launches eagerly takes at least the host's issue time of
its kernels (``Max(device time, kernels × host interval)``, :mod:`perfcast.rollup.fast`), in every
way the step model prices a step, and the serving notes say so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fuzzing import run_cli
from perfcast.serving.step import Deployment, compile_step
from perfcast.serving.types import Chunk, Mix


@pytest.fixture(scope="module")
def sglang():
    return compile_step(Deployment("llama-3.1-8b", "h100-sxm", "sglang"), max_tokens=4096)


def test_an_eager_prefill_waits_on_the_host_until_its_kernels_outlast_it(sglang):
    floor = sglang.host_floor_s(False, 1)
    kernels = floor / 5.719e-5  # SGLang's host interval per kernel (sglang.yaml)
    assert kernels == pytest.approx(round(kernels), abs=1e-6) and 200 < kernels < 1000
    assert sglang.step_s(Mix(chunks=(Chunk(1),))) == floor        # one token: the host's issue time
    big = sglang.step_s(Mix(chunks=(Chunk(4096),)))
    assert big > 2 * floor                                          # 4,096 tokens: the device's time
    assert sglang.host_floor_s(True, 8) == 0 and sglang.host_floor_s(True, 161) > 0  # graphs up to 160 on an H100


def test_every_way_of_pricing_a_step_applies_the_floor(sglang):
    chunks, decodes = [1, 64, 2048, 0, 0], [0, 3, 5, 8, 200]
    ctx = [0, 3 * 500, 5 * 900, 8 * 1024, 200 * 300]
    one = [sglang.step_s(Mix(d, c, (Chunk(s),) if s else ())) for d, c, s in zip(decodes, ctx, chunks)]
    arrays = sglang.step_s_array(decodes, ctx, chunks, [0] * 5, [1 if s else 0 for s in chunks])
    assert np.allclose(arrays, one, rtol=1e-9)
    many = sglang.step_many(decodes, ctx, chunks, [0] * 5)
    assert np.allclose(many, one, rtol=2e-3)  # exact contexts against the 16-token grid
    assert one[0] == sglang.host_floor_s(False, 1) and one[4] >= sglang.host_floor_s(True, 200) > 0
    dense, row, host = sglang.decode_row(200, 200 * 300)
    assert host == sglang.host_floor_s(True, 200) and sglang.decode_s(200, 200 * 300) == one[4]


def test_serve_names_the_eager_launches():
    rc, out, err = run_cli("serve", "llama-3.1-8b", "--device", "h100-sxm", "--engine", "sglang", "--isl", "128",
                           "--osl", "16", "--concurrency", "2", "--num-requests", "8", "--json")
    assert rc == 0, err
    note = next(n for n in json.loads(out)["notes"] if n.startswith("launches:"))
    assert "prefill steps are launched eagerly" in note and "CUDA graphs up to 160 sequences" in note
