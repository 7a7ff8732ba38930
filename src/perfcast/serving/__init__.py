"""Serving: TTFT, TPOT, ITL and throughput under load, on top of the engine-faithful step.

- :mod:`.types` — the plain, hashable inputs: a step's batch mix, the step-cost interface, the
  result both tiers report;
- :mod:`.step` — the step model compiled once per (model, engine, device, layout) from a
  symbolic capture, priced for any mix (or arrays of mixes) without re-capturing; :mod:`.memory`
  — the KV cache's size;
- :mod:`.scheduler`, :mod:`.policies`, :mod:`.kvcache` — the engines' schedulers as profile
  data, their per-step loops, the block pool with prefix reuse;
- :mod:`.workload` — closed loop, Poisson/gamma arrivals, traces, length distributions;
- :mod:`.sim` — the discrete-event simulation at step granularity; :mod:`.simtrace` its
  Perfetto trace;
- :mod:`.disagg` — the same simulation over a prefill pool and a decode pool (disaggregated);
  :mod:`.transfer` — the KV transfer priced on the topology;
- :mod:`.meanfield`, :mod:`.meanfield_disagg`, :mod:`.queueing` — the closed form (mean
  field) for searches; :mod:`.meanfield_grid` — the closed loop over arrays of load points;
- :mod:`.agreement` — the two tiers side by side;
- :mod:`.metrics` — the benchmark clients' metric definitions;
- :mod:`.serve`, :mod:`.serve_disagg` — ``perfcast serve``, the application;
- :mod:`.replay`, :mod:`.validation` — measured serving runs replayed through it.
"""
