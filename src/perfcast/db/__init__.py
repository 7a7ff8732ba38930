"""Profiling databases: importing measured kernel tables from other tools, and checking a
database against the format :mod:`perfcast.perf.profiling` reads."""
