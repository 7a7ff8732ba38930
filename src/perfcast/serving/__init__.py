"""Serving: TTFT, TPOT, ITL and throughput under load, on top of the engine-faithful step.

- :mod:`.types` — the plain, hashable inputs: a step's batch mix, the step-cost interface;
- :mod:`.step` — the step model compiled once per (model, engine, device, layout) from a
  symbolic capture, priced for any mix without re-capturing;
- :mod:`.sim` — the discrete-event simulation at step granularity (the engines' schedulers);
- :mod:`.disagg` — the same simulation over a prefill pool and a decode pool (disaggregated);
- :mod:`.meanfield` — the closed form (mean field) for searches;
- :mod:`.metrics` — the benchmark clients' metric definitions.
"""
