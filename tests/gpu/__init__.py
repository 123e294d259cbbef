"""Real engines on a GPU (marker `gpu`), skipped without one: see conftest.py and docs/gpu.md."""
