"""Where a search's screening runs: in this process (``local``) or on a Ray cluster (``ray``).

The unit of work is one *group* — a deployment's whole sweep of batch limits (aggregated), or a
device's whole disaggregated pairing — priced with one compiled step model: a vectorised batch
per task, never a task per point. The Ray executor submits every group, takes the results as they
finish (``ray.wait``) and keeps them by the group's index, so the points, the front and the
choice are the local executor's exactly, whatever the order of completion.

Ray (https://docs.ray.io/en/latest/ray-core/api/doc/ray.init.html): ``RAY_ADDRESS`` names a running
cluster (its workers need this perfcast installed); without it a local cluster is started with
``workers`` CPUs (default: all).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from perfcast.ir import UserError

EXECUTORS = ("local", "ray")


class LocalExecutor:
    name = "local"
    workers = 1

    def imap(self, fn: Callable, items: Sequence) -> Iterator[tuple[int, object]]:
        """``(index, fn(item))`` in order."""
        for i, item in enumerate(items):
            yield i, fn(item)

    def close(self) -> None:
        pass


class RayExecutor:
    """One Ray task per item, results as they complete (``ray.wait``), each with its index."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None):
        try:
            import ray
        except ImportError:  # pragma: no cover - ray is a dependency; a broken install says so
            raise UserError("--executor ray: the ray package is not importable; pip install ray") from None
        self._ray = ray
        self._started = False
        address = address or os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            if address:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            else:
                ray.init(num_cpus=workers or os.cpu_count(), include_dashboard=False, logging_level="ERROR",
                         log_to_driver=False)
                self._started = True
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def imap(self, fn: Callable, items: Sequence) -> Iterator[tuple[int, object]]:
        ray = self._ray
        task = ray.remote(num_cpus=1)(fn)
        pending = {task.remote(item): i for i, item in enumerate(items)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()


def executor(name: str, workers: int | None = None):
    if name == "local":
        if workers not in (None, 1):
            raise UserError("--workers applies to --executor ray")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(workers)
    raise UserError(f"--executor {name!r}: expected one of {', '.join(EXECUTORS)}")
