"""The symbolic operator IR. Depends on nothing else in perfcast."""

from perfcast.ir.cost import (
    BYTES_HBM,
    BYTES_ONCHIP,
    FLOPS_MATRIX,
    FLOPS_VECTOR,
    RESOURCES,
    Cost,
    link,
)
from perfcast.ir.dtypes import DTYPES, itemsize
from perfcast.ir.errors import UserError
from perfcast.ir.op import (
    Graph,
    Leaf,
    Loop,
    Op,
    Visit,
    cost,
    fold,
    leaves,
    rolled_leaves,
    trip_counts,
    walk,
)
from perfcast.ir.render import render
from perfcast.ir.rrt import RRT
from perfcast.ir.rules import make_leaf, register, work
from perfcast.ir.symbols import dim, dims, hw, result
from perfcast.ir.tensor import Tensor

__all__ = [
    "BYTES_HBM", "BYTES_ONCHIP", "FLOPS_MATRIX", "FLOPS_VECTOR", "RESOURCES", "Cost", "link",
    "DTYPES", "itemsize", "UserError",
    "Graph", "Leaf", "Loop", "Op", "Visit", "cost", "fold", "leaves", "rolled_leaves", "trip_counts",
    "walk",
    "render", "RRT", "make_leaf", "register", "work", "dim", "dims", "hw", "result", "Tensor",
]
