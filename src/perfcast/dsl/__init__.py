"""Front-end A: the tracing DSL for tiled kernels and blocks."""

from perfcast.dsl.builder import Builder, TraceError, trace

__all__ = ["Builder", "TraceError", "trace"]
