"""One job's measurement, pure (no Hydra, no MLflow): build, prepare, prefill, timed decode (timing, stats),
verification, the roofline, the GPU's state, the profiler's attribution."""
