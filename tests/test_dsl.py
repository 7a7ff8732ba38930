import pytest
import sympy

from perfcast.dsl import Builder, TraceError, trace
from perfcast.ir import FLOPS_MATRIX, FLOPS_VECTOR, Graph, Loop, cost, dims


def _gemm(b):
    M, N, K, m_blk = b.dims("M N K m_blk")
    A = b.hbm("A", (M, K))
    W = b.hbm("W", (K, N))
    C = b.hbm("C", (M, N))
    w = b.load_tile("w", W, (K, N))

    @b.parallel_map(b.tiles(M, m_blk), gather_axis=0)
    def rows():
        a = b.load_tile("a", A, (m_blk, K))
        return b.store_tile("c", b.matmul("mm", a, w), C)

    return rows


def test_matmul_and_gather_axis():
    M, N, K, m_blk = dims("M N K m_blk")
    holder = {}
    g = trace(lambda b: holder.setdefault("out", _gemm(b)), "gemm")
    assert cost(g)[FLOPS_MATRIX] == 2 * M * N * K
    assert holder["out"].shape == (M, N)
    assert g.launch


def test_padded_tiling_uses_ceiling():
    M, m_blk = dims("M m_blk")
    g = trace(_gemm, "gemm", padded=True)
    loop = [op for op in g.ops if isinstance(op, Loop)][0]
    assert loop.n_iter == sympy.ceiling(M / m_blk)


def test_block_makes_a_named_subgraph():
    b = Builder("k")
    (X,) = [b.hbm("X", (4, 8))]

    @b.block
    def softmax_like():
        x = b.load_tile("x", X, (4, 8))
        return b.exp("e", b.tensor_sub("c", x, b.reduce_max("m", x)))

    g = b.build()
    assert isinstance(g.ops[0], Graph) and g.ops[0].name == "softmax_like"
    # max: 32 reads; sub: 32 outputs; exp: 32 outputs.
    assert cost(g)[FLOPS_VECTOR] == 96
    assert softmax_like.shape == (4, 8)


def test_shape_errors_are_trace_errors():
    b = Builder("k")
    x = b.hbm("x", (4, 8))
    y = b.hbm("y", (4, 9))
    with pytest.raises(TraceError, match="do not broadcast"):
        b.tensor_add("z", x, y)
    with pytest.raises(TraceError, match="index k"):
        b.einsum("e", "mk,kn->mn", x, y)
    with pytest.raises(TraceError, match="used twice"):
        b.hbm("x", (1,))


def test_reduce_loop_checks_accumulators():
    b = Builder("k")
    acc = b.fill("acc", (4,))
    with pytest.raises(TraceError, match="accumulators"):
        @b.reduce_loop(3, init=[acc])
        def body(a, extra):
            return a
    b2 = Builder("k2")
    acc = b2.fill("acc", (4,))
    with pytest.raises(TraceError, match="shape"):
        @b2.reduce_loop(3, init=[acc])
        def body2(a):
            return b2.fill("wrong", (5,))


def test_launch_blocks_make_a_trace_a_program_of_kernels():
    from perfcast.hardware.device import get_device
    from perfcast.perf import AnalyticPerformanceModel
    from perfcast.rollup import rollup

    def two_kernels(b):
        (n,) = b.dims("n")
        x, y = b.hbm("x", (n,)), b.hbm("y", (n,))
        for name in ("first", "second"):
            @b.block(name=name, launch=True)
            def kernel():
                b.store_tile(f"{name}_store", b.exp(f"{name}_exp", b.load_tile(f"{name}_load", x, (n,))), y)

    def one_kernel(b):
        (n,) = b.dims("n")
        x = b.hbm("x", (n,))
        b.exp("e", b.load_tile("load", x, (n,)))

    program, single = trace(two_kernels), trace(one_kernel)
    assert not program.launch and single.launch  # the program's kernels are its launch blocks
    assert [op.launch for op in program.ops] == [True, True]
    model = AnalyticPerformanceModel(get_device("h100-sxm"))
    # one static launch latency per kernel: two for the program, one for the single kernel
    static = model.launch_overhead().time_s
    assert rollup(program, model).launch_time_s == 2 * static
    assert rollup(single, model).launch_time_s == static
