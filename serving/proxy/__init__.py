"""Auth proxy in front of the engine inside the serving container (an ASGI app on uvicorn).

Run: ``python -m serving.proxy --upstream http://127.0.0.1:8001 --port 8000`` with
``SERVING_API_KEYS`` set. Modules: ``app`` (routing, auth, admission, forwarding),
``relay`` (the engine's answer, relayed to the client), ``server`` (uvicorn's httptools
protocol with the head limits), ``runner`` (how a process serves, and why uvicorn),
``upstream`` (pooled HTTP/1.1 client to the engine), ``keys`` (key digests),
``metrics`` (Prometheus text), ``sse`` (drops usage-only chunks nobody asked for),
``__main__`` (CLI). Contract and figures: docs/proxy.md.
"""

from serving.proxy.app import ROUTES, ProxyApp, ProxyConfig
from serving.proxy.keys import ENV_VAR, KeyConfigError, KeyRing, digest_of

__all__ = ["ENV_VAR", "ROUTES", "KeyConfigError", "KeyRing", "ProxyApp", "ProxyConfig", "digest_of"]
