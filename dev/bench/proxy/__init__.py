"""Benchmark of the serving proxy: overhead vs calling the stub engine directly, nginx as floor.

Run ``python -m bench.proxy`` (or ``--quick``). Results and method: docs/proxy.md.
"""
