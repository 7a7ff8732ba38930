"""Pricing: performance models that turn a leaf's work into time."""

from perfcast.perf.analytic import AnalyticPerformanceModel
from perfcast.perf.empirical import DataSource, EmpiricalPerformanceModel, Miss, QueryResult
from perfcast.perf.model import BOUNDS, PerformanceModel, Provenance, Result, bound_of

__all__ = ["AnalyticPerformanceModel", "DataSource", "EmpiricalPerformanceModel", "Miss", "QueryResult", "BOUNDS", "PerformanceModel", "Provenance", "Result", "bound_of"]
