"""Provider benchmarks: Diff latency over the engine protocol, App deploy time vs `modal deploy`.

Run `python -m bench.providers` (or `make bench-providers`); see docs/providers.md.
"""
