"""The modulo-scheduling reference loop of ARCHITECTURE.md WE-3 (Rau, "Iterative Modulo
Scheduling", MICRO-27, 1994, §2 worked in its own terms).

Each of ``n`` iterations loads a tile (``ld``: the DMA engine for 2 cycles), multiplies it
(``mm``: the matrix unit for 4 cycles) and accumulates the product (``acc``: the vector unit for
1 cycle, its result ready ``acc_latency`` cycles after issue); ``acc`` feeds the next
iteration's ``acc`` (a recurrence of distance 1). One unit of each resource. ResMII = 4 (the
matrix unit), RecMII = ``acc_latency``; at ``acc_latency`` = 1: II = 4, one iteration 7 cycles,
``n`` = 8 → 7·4 + 7 = 35 cycles (the plain sum is 56, the pure resource bound 32); at
``acc_latency`` = 6: II = 6.

The tables are the kernel's own (``Builder.reserve``), in cycles: the slow roll-up schedules
them as given; the fast roll-up prices the same leaves on the device as usual.
"""

from __future__ import annotations

from perfcast.ir import RRT
from perfcast.kernels.registry import kernel


@kernel("modulo-reference", defaults=dict(n=8, acc_latency=1, m=128, k=128),
        description="WE-3 modulo-scheduling reference: ld (DMA 2) → mm (MXU 4) → acc (VPU 1, carried)")
def modulo_reference(b):
    n, acc_latency, m, k = b.dims("n acc_latency m k")
    x = b.hbm("X", (n * m, k))
    w = b.hbm("W", (k, k))
    acc0 = b.hbm("acc0", (m, k))

    @b.reduce_loop(n, init=[acc0])
    def body(partial):
        tile = b.load_tile("ld", x, (m, k))
        b.reserve("ld", RRT.single("dma", 2))
        prod = b.matmul("mm", tile, w)
        b.reserve("mm", RRT.single("mxu", 4))
        out = b.tensor_add("acc", partial, prod)
        b.reserve("acc", RRT.single("vpu", 1, latency=acc_latency))
        return out
