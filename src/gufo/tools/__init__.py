"""Tools built on the engine: benchmarks, quality checks, synthetic models, the kernel checker."""
