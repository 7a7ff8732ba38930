"""Data shipped with perfcast: profiling databases (``profiling/``) and the measured serving runs
``perfcast validate`` compares against (``validation/``)."""
