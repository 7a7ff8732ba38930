"""Data shipped with perfcast: profiling databases (``profiling/``)."""
