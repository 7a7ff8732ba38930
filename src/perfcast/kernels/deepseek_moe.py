"""A DeepSeekMoE block with expert parallelism, per device.

The block (DeepSeekMoE: Dai et al., arXiv:2401.06066, §3.1 fine-grained experts, §3.2 shared
expert isolation; DeepSeek-V3 technical report, arXiv:2412.19437, §2.1.2, eqs. 12-16):
``h = u + Σ_shared FFN_s(u) + Σ_{top-k routed} g_i·FFN_i(u)``, every FFN a SwiGLU MLP
``down(silu(u·W_gate) ⊙ u·W_up)`` of intermediate width ``I_moe``; routing scores are
``sigmoid(u·e_i)`` and each token goes to its ``top_k`` highest-scoring experts. The defaults are
DeepSeek-V3's (``models/configs/deepseek-v3.json``: hidden_size 7168, moe_intermediate_size
2048, n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1) at T = 4096 tokens.

Parallelism: the mesh is ``ep × tp`` (sizes ``EP``, ``TP``; default 8 × 1). The ``T`` tokens form
``EP`` token groups, one per ``ep`` rank (the token dim sharded over ``ep``, replicated over
``tp``); routed experts are sharded over ``ep`` and the expert and shared-expert intermediate
dim over ``tp``. Routed tokens travel in GShard's layout (Lepikhin et al., arXiv:2006.16668,
§2.2): a buffer ``(token group, expert, slot, hidden)``. The dispatch **all-to-all** moves ``ep``
from the token-group dim to the expert dim, the expert GEMMs run on the local ``E/EP`` experts,
and the combine all-to-all moves ``ep`` back (V3 report §3.2.2 for the dispatch/combine
all-to-alls, §3.4 for expert parallelism at inference). Those two are the only collectives
written here; the sharded einsums infer the rest — an all-reduce over ``tp`` after each down
projection (partial sums over the sharded intermediate dim), which costs nothing at ``TP = 1``.

Assumptions: **balanced routing** — every expert receives ``T·top_k/E`` tokens, ``C =
T·top_k/(E·EP)`` from each token group, so no slot is empty or dropped (V3 balances load with
auxiliary-loss-free bias terms, §2.1.2, but no real batch is exactly balanced). The gathers that
bucket tokens by expert and bring them back are device-local copies. Node-limited routing
(``topk_group``) and the normalisation of the ``top_k`` gate values are not modelled (vector
work on ``T·top_k`` values). Weights and the block's input and output cross HBM once; the
intermediates are counted as on-chip traffic, as every DSL einsum and vector op is.
"""

from __future__ import annotations

from perfcast.kernels.registry import kernel

_DEFAULTS = dict(T=4096, D=7168, I_moe=2048, E=256, top_k=8, n_shared=1, EP=8, TP=1)


@kernel("deepseek-moe", defaults=_DEFAULTS,
        description="DeepSeekMoE block (DeepSeek-V3 sizes): router, shared expert, routed experts "
                    "over ep with dispatch/combine all-to-alls, optional tp")
def deepseek_moe(b):
    T, D, I_moe, E, top_k, n_shared, EP, TP = b.dims("T D I_moe E top_k n_shared EP TP")
    b.mesh(ep=EP, tp=TP)
    C = T * top_k / (E * EP)  # balanced routing: slots per (token group, expert)
    x = b.hbm("x", (T, D), sharding=("ep", None))
    out = b.hbm("out", (T, D), sharding=("ep", None))
    w_router = b.hbm("w_router", (D, E))
    w_shared = [b.hbm(f"w_shared_{p}", (D, n_shared * I_moe), sharding=(None, "tp"))
                for p in ("gate", "up")]
    w_shared_down = b.hbm("w_shared_down", (n_shared * I_moe, D), sharding=("tp", None))
    w_expert = [b.hbm(f"w_{p}", (E, D, I_moe), sharding=("ep", None, "tp")) for p in ("gate", "up")]
    w_down = b.hbm("w_down", (E, I_moe, D), sharding=("ep", "tp", None))

    def load(t):
        return b.load_tile(f"load_{t.name}", t, t.shape)

    u = load(x)

    @b.block
    def router():
        logits = b.einsum("logits", "td,de->te", u, load(w_router))
        return b.top_k("top_k", b.sigmoid("scores", logits), top_k)

    gates, index = router

    @b.block
    def shared_expert():
        gate, up = (b.einsum(f"shared_{p}", "td,df->tf", u, load(w)) for p, w in zip(("gate", "up"), w_shared))
        h = b.tensor_mul("shared_h", b.silu("shared_act", gate), up)
        return b.einsum("shared_down", "tf,fd->td", h, load(w_shared_down))  # partial over tp

    @b.block
    def routed_experts():
        buckets = b.gather("permute", u, index, (EP, E, C, D), sharding=("ep", None, None, None))
        xe = b.all_to_all("dispatch", buckets, from_dim=0, to_dim=1, axis="ep")
        gate, up = (b.einsum(f"expert_{p}", "gecd,edi->geci", xe, load(w)) for p, w in zip(("gate", "up"), w_expert))
        h = b.tensor_mul("expert_h", b.silu("expert_act", gate), up)
        y = b.einsum("expert_down", "geci,eid->gecd", h, load(w_down))  # partial over tp
        back = b.all_to_all("combine", y, from_dim=1, to_dim=0, axis="ep")
        pairs = b.gather("unpermute", back, index, (T, top_k, D), sharding=("ep", None, None))
        return b.einsum("weighted_sum", "tkd,tk->td", pairs, gates)

    b.store_tile("store", b.tensor_add("moe_out", shared_expert, routed_experts), out)
