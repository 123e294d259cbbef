"""The GPU harness: real engines through serving/engine.py and the proxy, on the lent GPU.

- ``python -m bench.gpu.payload`` (here): builds ``.gpu-payload/`` (vLLM 0.26.0 and the wheels
  the GPU image lacks, in two parts that each fit one device call);
- ``python3 -m bench.gpu.remote prepare`` then ``run`` (on the GPU machine, two calls back to
  back): unpack, model, flags, then ``pytest tests/gpu`` and the direct-vs-proxy bench
  (``bench.gpu.load``), results as JSON in ``$OUT``;
- ``bench.gpu.mkmodel``: a random-initialised model of a real shape (no hub there);
- ``bench.gpu.flags_shim``: scripts/record_engine_flags.py for vLLM releases older than it.

docs/gpu.md has the exact calls and every result.
"""
