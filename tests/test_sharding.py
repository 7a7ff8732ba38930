"""Sharding in the DSL: per-device leaves and the collectives a sharded einsum infers
(ARCHITECTURE.md §2, docs/design/sharding.md)."""

import itertools

import pytest
import sympy

from perfcast.dsl import Builder, TraceError, trace
from perfcast.dsl.sharding import Collective, collectives, plan_einsum
from perfcast.ir import FLOPS_MATRIX, Tensor, cost, dim, dims, leaves, link, rolled_leaves
from perfcast.kernels import catalog, get_kernel

T, D, F, M, K, N = dims("T D F M K N")


def _leaf(g, name):
    return next(leaf for leaf in leaves(g) if leaf.name == name)


def _mlp(out_sharding=None, tp=8):
    """Megatron-LM MLP (Shoeybi et al., arXiv:1909.08053, §3): column-parallel up projection,
    row-parallel down projection."""

    def fn(b):
        b.mesh(tp=tp)
        x = b.hbm("x", (T, D))
        w1 = b.hbm("w1", (D, F), sharding=(None, "tp"))
        w2 = b.hbm("w2", (F, D), sharding=("tp", None))
        h = b.einsum("up", "td,df->tf", x, w1)
        assert h.sharding == ((), ("tp",))  # inferred: f keeps w1's sharding
        y = b.einsum("down", "tf,fd->td", h, w2, out_sharding=out_sharding)
        fn.out = y

    return trace(fn, "mlp"), fn


# Rule (b): partial sums ------------------------------------------------------------------------
def test_row_parallel_einsum_infers_one_all_reduce():
    g, fn = _mlp()
    # message: the (T, D) bf16 partial result = 2·T·D bytes; link bytes 2·(8−1)/8 of that
    assert collectives(g) == [Collective("down.all_reduce", "all_reduce", "tp", 8, 2 * T * D, True)]
    assert cost(g)[link("tp")] == sympy.Rational(7, 2) * T * D
    assert fn.out.sharding == ((), ()) and fn.out.shape == (T, D)
    # per-device einsums: 2·T·D·F/8 FLOPs each
    assert rolled_leaves(g)["up"][FLOPS_MATRIX] == T * D * F / 4
    assert [t.shape for t in _leaf(g, "down").inputs] == [(T, F / 8), (F / 8, D)]


def test_requested_output_sharding_turns_it_into_a_reduce_scatter():
    g, fn = _mlp(out_sharding=("tp", None))
    # message: the unscattered input, 2·T·D bytes; each device ends with (T/8, D)
    assert collectives(g) == [Collective("down.reduce_scatter", "reduce_scatter", "tp", 8, 2 * T * D, True)]
    rs = _leaf(g, "down.reduce_scatter")
    assert rs.inputs[0].shape == (T, D) and rs.outputs[0].shape == (T / 8, D)
    assert cost(g)[link("tp")] == sympy.Rational(7, 4) * T * D  # 7/8 · 2·T·D
    assert fn.out.sharding == (("tp",), ())


def test_symbolic_mesh_size():
    TP = dim("TP")
    g, _ = _mlp(tp="TP")
    assert collectives(g) == [Collective("down.all_reduce", "all_reduce", "tp", TP, 2 * T * D, True)]
    assert cost(g)[link("tp")] == sympy.expand(4 * T * D * (TP - 1) / TP)
    assert cost(g)[FLOPS_MATRIX] == 4 * T * D * F / TP


def test_partial_sums_on_one_axis_of_a_two_axis_mesh():
    b = Builder("k")
    b.mesh(dp=2, tp=4)
    x = b.hbm("x", (M, K), sharding=("dp", "tp"))
    w = b.hbm("w", (K, N), sharding=("tp", None))
    y = b.einsum("mm", "mk,kn->mn", x, w)
    g = b.build()
    # local result (M/2, N), partial over tp: message 2·M·N/2 = M·N
    assert collectives(g) == [Collective("mm.all_reduce", "all_reduce", "tp", 4, M * N, True)]
    assert y.sharding == (("dp",), ())


# Rule (a): a contraction dim sharded in one operand only ---------------------------------------
def test_contraction_dim_sharded_in_one_operand_gathers_it():
    b = Builder("k")
    b.mesh(tp=8)
    x = b.hbm("x", (M, K), sharding=(None, "tp"))
    w = b.hbm("w", (K, N))
    y = b.einsum("mm", "mk,kn->mn", x, w)
    g = b.build()
    # all-gather of a local (M, K/8) tile to (M, K): message M·K·2 bytes
    assert collectives(g) == [Collective("mm.all_gather.x", "all_gather", "tp", 8, 2 * M * K, True)]
    ag, mm = leaves(g)
    assert (ag.inputs[0].shape, ag.outputs[0].shape) == ((M, K / 8), (M, K))
    assert mm.inputs[0].shape == (M, K) and mm.inputs[0].name == "mm.all_gather.x"
    assert y.sharding == ((), ()) and cost(g)[FLOPS_MATRIX] == 2 * M * N * K  # replicated work


def test_gathers_innermost_axis_first_down_to_the_common_prefix():
    b = Builder("k")
    b.mesh(dp=2, tp=4)
    x = b.hbm("x", (M, K), sharding=(None, "dp"))
    w = b.hbm("w", (K, N), sharding=(("dp", "tp"), None))
    b.einsum("mm", "mk,kn->mn", x, w)
    g = b.build()
    # w: k over dp+tp, x: k over dp → common prefix dp; w gathers tp: (K/8, N) → (K/2, N),
    # message 2·K·N/2 = K·N; partial sums over dp remain: all-reduce of (M, N), 2·M·N bytes
    assert collectives(g) == [
        Collective("mm.all_gather.w", "all_gather", "tp", 4, K * N, True),
        Collective("mm.all_reduce", "all_reduce", "dp", 2, 2 * M * N, True)]


def test_two_gathers_of_one_operand_are_named_by_axis():
    b = Builder("k")
    b.mesh(dp=2, tp=4)
    w = b.hbm("w", (K, N), sharding=(("dp", "tp"), None))
    b.einsum("mm", "mk,kn->mn", b.hbm("x", (M, K)), w)
    assert [(c.name, c.message_bytes) for c in collectives(b.build())] == [
        ("mm.all_gather.w.tp", K * N),  # (K/8, N) → (K/2, N), bf16
        ("mm.all_gather.w.dp", 2 * K * N)]  # (K/2, N) → (K, N)


# Rule (c): kept dims ---------------------------------------------------------------------------
def test_output_asking_for_a_replicated_dim_gathers_the_result():
    b = Builder("k")
    b.mesh(tp=8)
    x = b.hbm("x", (M, K), sharding=("tp", None))
    y = b.einsum("mm", "mk,kn->mn", x, b.hbm("w", (K, N)), out_sharding=(None, None))
    g = b.build()
    # the local (M/8, N) result gathered to (M, N): message 2·M·N
    assert collectives(g) == [Collective("mm.all_gather", "all_gather", "tp", 8, 2 * M * N, True)]
    assert rolled_leaves(g)["mm"][FLOPS_MATRIX] == M * N * K / 4  # 2·M·N·K/8
    assert y.sharding == ((), ())


def test_replicated_operands_slice_for_free():
    b = Builder("k")
    b.mesh(tp=8)
    x = b.hbm("x", (M, K))
    y = b.einsum("mm", "mk,kn->mn", x, b.hbm("w", (K, N)), out_sharding=("tp", None))
    g = b.build()
    assert collectives(g) == []
    assert _leaf(g, "mm").inputs[0].shape == (M / 8, K)
    assert y.sharding == (("tp",), ())


def test_non_contraction_dims_keep_their_operands_sharding():
    b = Builder("k")
    b.mesh(ep=4)
    a = b.hbm("a", (M, K, N), sharding=("ep", None, None))
    c = b.hbm("c", (M, N, F))
    y = b.einsum("bmm", "mkn,mnf->mkf", a, c)
    assert y.sharding == (("ep",), (), ())
    assert _leaf(b.build(), "bmm").inputs[1].shape == (M / 4, N, F)


def test_elementwise_ops_broadcast_shardings():
    b = Builder("k")
    b.mesh(ep=4)
    x = b.hbm("x", (T, D), sharding=("ep", None))
    y = b.tensor_add("y", x, b.hbm("bias", (1, D)))
    z = b.tensor_mul("z", b.silu("act", y), b.hbm("r", (T, D)))  # r replicated: sliced for free
    assert y.sharding == z.sharding == (("ep",), ())
    g = b.build()
    assert [t.shape for t in _leaf(g, "y").inputs] == [(T / 4, D), (1, D)]  # the bias stays whole
    assert [t.shape for t in _leaf(g, "z").inputs] == [(T / 4, D), (T / 4, D)]
    assert collectives(g) == []


def test_plan_is_a_pure_function_of_index_strings_and_shardings():
    plan = plan_einsum("mm", ["mk", "kn"], "mn", [((), ("tp",)), (("tp",), ())], ["x", "w"],
                       (("tp",), ()))
    assert [(s.kind, s.axis, s.dim, s.name) for s in plan.after] == [
        ("reduce_scatter", "tp", 0, "mm.reduce_scatter")]
    assert plan.before == () and plan.partial == ("tp",) and plan.out == (("tp",), ())


# Hand-written collectives ----------------------------------------------------------------------
def test_all_to_all_moves_an_axis_between_dims():
    b = Builder("k")
    b.mesh(ep=8)
    x = b.hbm("x", (8, M, D), sharding=("ep", None, None))
    y = b.all_to_all("a2a", x, from_dim=0, to_dim=1, axis="ep")
    assert y.sharding == ((), ("ep",), ()) and y.shape == (8, M, D)
    (leaf,) = leaves(b.build())
    assert (leaf.inputs[0].shape, leaf.outputs[0].shape) == ((1, M, D), (8, M / 8, D))
    assert leaf.cost[link("ep")] == sympy.Rational(7, 8) * 2 * M * D  # (n−1)/n of 2·M·D bytes


def test_explicit_gather_reduce_scatter_and_all_reduce():
    b = Builder("k")
    b.mesh(tp=8)
    x = b.hbm("x", (M, K), sharding=("tp", None))
    full = b.all_gather("ag", x, dim=0)
    part = b.reduce_scatter("rs", full, dim=1, axis="tp")
    b.all_reduce("ar", b.hbm("p", (M, K)), axis="tp")
    assert full.sharding == ((), ()) and part.sharding == ((), ("tp",))
    assert [(c.kind, c.message_bytes, c.inferred) for c in collectives(b.build())] == [
        ("all_gather", 2 * M * K, False), ("reduce_scatter", 2 * M * K, False),
        ("all_reduce", 2 * M * K, False)]


# DeepSeekMoE -----------------------------------------------------------------------------------
MOE = get_kernel("deepseek-moe")
E, top_k, I_moe, EP, TP, n_shared = dims("E top_k I_moe EP TP n_shared")
AT = {dim(k): v for k, v in MOE.defaults.items()}


def test_deepseek_moe_collectives():
    calls = collectives(MOE.graph)
    assert [(c.name, c.kind, c.axis, c.group_size) for c in calls if not c.inferred] == [
        ("dispatch", "all_to_all", "ep", EP), ("combine", "all_to_all", "ep", EP)]
    assert [(c.name, c.kind, c.axis, c.group_size) for c in calls if c.inferred] == [
        ("shared_down.all_reduce", "all_reduce", "tp", TP),
        ("expert_down.all_reduce", "all_reduce", "tp", TP)]
    routed = 2 * T * top_k * D / EP  # a device's T/EP tokens, top_k copies each, bf16
    assert {c.name: c.message_bytes for c in calls} == {
        "dispatch": routed, "combine": routed, "expert_down.all_reduce": routed,
        "shared_down.all_reduce": 2 * T * D / EP}
    # at the default point: 2 · 4096·8·7168/8 bytes = 58,720,256
    assert {c.name: c.message_bytes.subs(AT) for c in calls}["dispatch"] == 58_720_256


def test_deepseek_moe_dispatch_moves_ep_from_token_groups_to_experts():
    g = MOE.graph
    dispatch, combine = _leaf(g, "dispatch"), _leaf(g, "combine")
    C = T * top_k / (E * EP)  # balanced routing: slots per (token group, expert)
    assert dispatch.inputs[0].shape == (1, E, C, D)  # own token group, all experts
    assert dispatch.outputs[0].shape == (EP, E / EP, C, D)  # all groups, local experts
    assert dispatch.outputs[0].sharding == ((), ("ep",), (), ())
    assert combine.outputs[0].shape == (1, E, C, D)
    total = cost(g)
    assert total[link("ep")] == sympy.expand(2 * 2 * T * top_k * D / EP * (EP - 1) / EP)
    # TP = 8: two all-reduces, 2·7/8 of (2·T·D/EP)·(1 + top_k) bytes = 1.75 · 7,340,032 · 9
    assert total.subs({**AT, TP: 8})[link("tp")] == 115_605_504 == 7 * 2 * 4096 * 7168 // 8 * 9 // 4
    assert link("tp") not in total.subs(AT)  # TP = 1: the inferred all-reduces move nothing


def test_deepseek_moe_work_per_device():
    leaves_ = rolled_leaves(MOE.graph)
    # each expert GEMM: 2 · (T·top_k/EP tokens) · D · I_moe/TP
    for name in ("expert_gate", "expert_up", "expert_down"):
        assert leaves_[name][FLOPS_MATRIX] == 2 * T * top_k * D * I_moe / (EP * TP)
    assert leaves_["shared_down"][FLOPS_MATRIX] == 2 * T * D * n_shared * I_moe / (EP * TP)
    # a device's routed weights: E/EP experts × 3 matrices × D·I_moe/TP × 2 B = 2,818,572,288 B at V3 sizes
    routed_w = sum(leaves_[f"load_w_{p}"].subs(AT)["bytes.hbm"] for p in ("gate", "up", "down"))
    assert routed_w == 32 * 3 * 7168 * 2048 * 2


def test_deepseek_moe_is_listed():
    assert "deepseek-moe" in catalog()
    assert MOE.defaults == dict(T=4096, D=7168, I_moe=2048, E=256, top_k=8, n_shared=1, EP=8, TP=1)


# Unsharded traces are untouched ----------------------------------------------------------------
def test_unsharded_traces_carry_no_sharding():
    for name in ("flash-attention", "flash-attention-softmax"):
        g = get_kernel(name).graph
        assert all(t.sharding is None for leaf in leaves(g) for t in (*leaf.inputs, *leaf.outputs))
        assert collectives(g) == []
    b = Builder("k")
    b.mesh(tp=8)  # a mesh alone shards nothing
    b.einsum("mm", "mk,kn->mn", b.hbm("x", (M, K)), b.hbm("w", (K, N)))
    (mm,) = leaves(b.build())
    assert mm.inputs[0] == Tensor("x", (M, K), "bf16") and mm.cost[FLOPS_MATRIX] == 2 * M * N * K


# Errors ----------------------------------------------------------------------------------------
def _builder(**mesh):
    b = Builder("k")
    if mesh:
        b.mesh(**mesh)
    return b


@pytest.mark.parametrize("mesh, shape, sharding, message", [
    ({"tp": 8}, (M, K), ("xp", None), "hbm x: unknown mesh axis 'xp'; the mesh has tp"),
    ({"tp": 8}, (M, K), ("tp", "tp"), "hbm x: mesh axis 'tp' shards both dim 0 and dim 1 of the sharding"),
    ({"tp": 8}, (M, K), (("tp", "tp"), None), "hbm x: mesh axis 'tp' shards dim 0 twice"),
    ({"tp": 8}, (M, K), ("tp",), r"hbm x: sharding \('tp',\) needs one entry per dim \(2\)"),
    ({"tp": 8}, (M, K), (0, None), "hbm x: sharding entry 0 is not None, an axis name or a tuple"),
    ({}, (M, K), ("tp", None), "hbm x: a sharding needs a mesh"),
    ({"tp": 8}, (12, K), ("tp", None), r"hbm x: dim 0 of x \(12\) does not divide over tp \(8\)"),
])
def test_bad_shardings(mesh, shape, sharding, message):
    with pytest.raises(TraceError, match=message):
        _builder(**mesh).hbm("x", shape, sharding=sharding)


def test_bad_meshes():
    with pytest.raises(TraceError, match="size 0 is not a positive integer"):
        _builder(tp=0)
    with pytest.raises(TraceError, match="size 2.5 is not a positive integer"):
        _builder(tp=2.5)
    b = _builder(tp=8)
    with pytest.raises(TraceError, match="mesh is already declared"):
        b.mesh(dp=2)


def test_einsum_errors_name_the_einsum_and_the_mismatch():
    b = _builder(ep=8, tp=4)
    x = b.hbm("x", (M, K), sharding=("ep", None))
    w = b.hbm("w", (M, N), sharding=("tp", None))
    with pytest.raises(TraceError, match=r"^einsum e1: index m is sharded over tp in w but over ep in x$"):
        b.einsum("e1", "mk,mn->mkn", x, w)
    with pytest.raises(TraceError, match="^einsum e2: index m is sharded over ep in the operands but the "
                                         "output asks for tp$"):
        b.einsum("e2", "mk,kn->mn", x, b.hbm("v", (K, N)), out_sharding=("tp", None))
    p = b.hbm("p", (M, K), sharding=(None, "tp"))
    q = b.hbm("q", (K, N), sharding=("tp", None))
    with pytest.raises(TraceError, match="^einsum e3: output index m asks for tp\\+ep, but tp holds partial"):
        b.einsum("e3", "mk,kn->mn", p, q, out_sharding=(("tp", "ep"), None))
    with pytest.raises(TraceError, match="^einsum e4: unknown mesh axis 'dp'"):
        b.einsum("e4", "mk,kn->mn", p, q, out_sharding=("dp", None))
    with pytest.raises(TraceError, match="^einsum e5: output index z appears in no operand$"):
        b.einsum("e5", "mk,kn->mz", p, q)


def test_other_ops_refuse_inconsistent_shardings():
    b = _builder(ep=8, tp=4)
    x = b.hbm("x", (M, K), sharding=("ep", None))
    y = b.hbm("y", (M, K), sharding=("tp", None))
    with pytest.raises(TraceError, match="^add z: dim 0 of the result is sharded over tp in y but over ep in x$"):
        b.tensor_add("z", x, y)
    with pytest.raises(TraceError, match="^sum s: dim 0 of x is sharded over ep; all_gather it first$"):
        b.reduce_sum("s", x, axis=0)
    with pytest.raises(TraceError, match="^all_to_all a: x is not sharded over ep on dim 1$"):
        b.all_to_all("a", x, from_dim=1, to_dim=0, axis="ep")
    with pytest.raises(TraceError, match="^all_to_all a2: it moves ep from dim 0 to itself$"):
        b.all_to_all("a2", x, from_dim=0, to_dim=0, axis="ep")
    with pytest.raises(TraceError, match="^all_reduce r: x is already sharded over ep$"):
        b.all_reduce("r", x, axis="ep")
    with pytest.raises(TraceError, match="^all_gather g: unknown mesh axis 'dp'"):
        b.all_gather("g", x, dim=0, axis="dp")
    with pytest.raises(TraceError, match="^top_k t: the last dim of y2 is sharded over tp"):
        b.top_k("t", b.hbm("y2", (M, K), sharding=(None, "tp")), 2)


# A property: the sharded einsum's per-device work, times the devices that split it, is the whole.
def test_local_work_times_splitting_devices_is_the_global_work():
    layouts = [None, "a", "b", ("a", "b"), ("b", "a")]
    valid = 0
    for x0, x1, w0, w1 in itertools.product(layouts, repeat=4):
        b = _builder(a=2, b=3)
        try:
            x = b.hbm("x", (M, K), sharding=(x0, x1))
            w = b.hbm("w", (K, N), sharding=(w0, w1))
            b.einsum("mm", "mk,kn->mn", x, w)
        except TraceError:
            continue  # an axis used twice in one tensor, or kept dims sharded incompatibly
        valid += 1
        mm = _leaf(b.build(), "mm")
        used = {a for t in (*mm.inputs, *mm.outputs) for axes in t.sharding for a in axes}
        devices = sympy.prod([{"a": 2, "b": 3}[a] for a in used])
        assert mm.cost[FLOPS_MATRIX] * devices == 2 * M * N * K, (x0, x1, w0, w1)
    assert valid > 50
