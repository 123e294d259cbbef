"""Benchmark the Modal dynamic providers the way the Pulumi engine drives them.

    python -m bench.providers [--diff-iterations 2000] [--deploys 5] [--json PATH]

One emulator (`python -m emulator serve`, in memory) and one provider server
(`python -m pulumi.dynamic`, through pulumi_standin's ProviderServer) for the whole run:

1. Diff latency: gRPC Diff round trips on unchanged inputs (the call `pulumi preview` makes for
   every resource), for a Secret (pure comparison) and for the App deploying serving/app.py
   (hashes every shipped source file on each Diff). Baseline in the same run: the gRPC round
   trip of GetPluginInfo on the same server, the floor any Diff pays. Target: p50 <= 5 ms.
   Those are warm calls; a real `pulumi preview` starts a fresh provider process, so the run
   also measures the FIRST Check and Diff of each resource on --cold-starts fresh provider
   servers (engine order: Check, then Diff; median and max reported).
2. Deploy time: the App provider's Update (subprocess deploy runner + read-back of URL and
   version) vs raw `modal deploy serving/app.py` of the same app, same spec, same emulator,
   alternating, median of N each. Target: provider <= 1.1x raw.
3. Health gate (issue 11; --gate-rounds, 0 = skip): N updates of serving/app.py with the
   stand-in engine and `min_containers: 1`, each with a changed spec, gated (proxy token +
   API key through the edge). For each, the new container's own `ready_at` (the emulator's
   `/_emulator/containers`) is the baseline in the same run: "gate added" = when the gated
   Update returned minus when that container was ready. Target: median <= 3 s. Needs the
   emulator to run the serving container.

Prints a table and writes JSON to data/bench-results/providers.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2

from components.modal import AppProvider, SecretProvider, VolumeProvider
from emulator.process import EmulatorProcess
from pulumi_standin import PROJECT_ROOT, Engine, ProviderServer, Secret
from serving.spec import ServingSpec

APP_FILE = "serving/app.py"
APP_NAME = "bench-llm"


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _time_calls(fn: Callable[[], Any], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _spec() -> str:
    return ServingSpec.model_validate(
        {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": "qwen"}
    ).to_json()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--diff-iterations", type=int, default=2000)
    ap.add_argument("--deploys", type=int, default=5)
    ap.add_argument("--cold-starts", type=int, default=5)
    ap.add_argument("--gate-rounds", type=int, default=3)
    ap.add_argument("--json", default=str(PROJECT_ROOT / "data/bench-results/providers.json"))
    args = ap.parse_args(argv)

    results: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    with EmulatorProcess() as emu, ProviderServer(env=emu.subprocess_env()) as srv:
        eng = Engine(srv)
        sp, app = SecretProvider(), AppProvider()
        keys = {"SERVING_API_KEYS": json.dumps({"bench": "sha256:" + "0" * 64})}
        secret_in = {"name": "serving-api-keys", "environment": "main", "values": Secret(keys)}
        eng.up("keys", sp, secret_in)
        # serving/app.py looks its volumes up by name: create them first, as the component does.
        vols = ServingSpec.model_validate_json(_spec()).volumes
        for vol in (vols.hf_cache, vols.engine_cache):
            eng.up(f"vol-{vol}", VolumeProvider(), {"name": vol, "environment": "main"})
        app_in = {
            "name": APP_NAME,
            "environment": "main",
            "app_file": APP_FILE,
            "spec_json": _spec(),
        }
        eng.up("app", app, app_in)

        # ---- 1. Diff latency -------------------------------------------------------------
        n = args.diff_iterations
        s_state, a_state = eng.states["keys"], eng.states["app"]
        stub = srv._stub
        assert stub is not None
        floor = _time_calls(lambda: stub.GetPluginInfo(empty_pb2.Empty()), n)
        sdiff = _time_calls(lambda: srv.diff(sp, s_state.id, s_state.outputs, secret_in), n)
        adiff = _time_calls(
            lambda: srv.diff(app, a_state.id, a_state.outputs, app_in), max(200, n // 4)
        )
        assert srv.diff(sp, s_state.id, s_state.outputs, secret_in).changes == "none"
        assert srv.diff(app, a_state.id, a_state.outputs, app_in).changes == "none"
        results["diff_ms"] = {
            name: {
                "n": len(v),
                "p50": _pct(v, 0.5),
                "p99": _pct(v, 0.99),
                "mean": statistics.mean(v),
            }
            for name, v in (
                ("grpc_floor(GetPluginInfo)", floor),
                ("Secret Diff", sdiff),
                ("App Diff (serving/app.py)", adiff),
            )
        }

        # ---- 1b. First call on a fresh provider process (what a real preview pays) ----------
        cold: dict[str, list[float]] = {}
        for _ in range(args.cold_starts):
            for label, prov, st, inp in (
                ("Secret", sp, s_state, secret_in),
                ("App (serving/app.py)", app, a_state, app_in),
            ):
                with ProviderServer(env=emu.subprocess_env()) as fresh:
                    t0 = time.perf_counter()
                    chk = fresh.check(prov, inp, st.inputs)
                    t1 = time.perf_counter()
                    d0 = fresh.diff(prov, st.id, st.outputs, chk.inputs, old_inputs=st.inputs)
                    t2 = time.perf_counter()
                    assert d0.changes == "none"
                cold.setdefault(f"{label} first Check", []).append((t1 - t0) * 1000)
                cold.setdefault(f"{label} first Diff", []).append((t2 - t1) * 1000)
        results["first_call_ms"] = {
            name: {"n": len(v), "median": statistics.median(v), "max": max(v)}
            for name, v in cold.items()
        }

        # ---- 2. Deploy time ----------------------------------------------------------------
        with tempfile.TemporaryDirectory() as tmp:
            spec_path = Path(tmp) / "spec.json"
            spec_path.write_text(_spec())
            raw_env = emu.subprocess_env(
                {"SERVING_SPEC": str(spec_path), "SERVING_APP_NAME": APP_NAME}
            )
            modal_bin = str(Path(sys.executable).parent / "modal")
            raw_cmd = [modal_bin, "deploy", APP_FILE, "--name", APP_NAME]
            provider_s: list[float] = []
            raw_s: list[float] = []
            for _ in range(args.deploys):
                t0 = time.perf_counter()
                outs = srv.update(app, a_state.id, a_state.outputs, app_in)
                provider_s.append(time.perf_counter() - t0)
                assert outs["app_id"] == a_state.id
                t0 = time.perf_counter()
                subprocess.run(
                    raw_cmd, env=raw_env, cwd=PROJECT_ROOT, check=True, capture_output=True
                )
                raw_s.append(time.perf_counter() - t0)
        p_med, r_med = statistics.median(provider_s), statistics.median(raw_s)
        results["deploy_s"] = {
            "provider_update": {"n": len(provider_s), "median": p_med, "min": min(provider_s)},
            "raw_modal_deploy": {"n": len(raw_s), "median": r_med, "min": min(raw_s)},
            "ratio_median": p_med / r_med,
        }

        # ---- 3. Health gate ------------------------------------------------------------------
        if args.gate_rounds:
            results["gate_s"] = _bench_gate(emu, eng, args.gate_rounds)

    d = results["diff_ms"]
    print("\nDiff latency over the engine protocol (ms)")
    print(f"{'call':<30}{'n':>7}{'p50':>9}{'p99':>9}{'mean':>9}")
    for name, v in d.items():
        print(f"{name:<30}{v['n']:>7}{v['p50']:>9.2f}{v['p99']:>9.2f}{v['mean']:>9.2f}")
    worst_p50 = max(d["Secret Diff"]["p50"], d["App Diff (serving/app.py)"]["p50"])
    print(
        f"target p50 <= 5 ms: {'PASS' if worst_p50 <= 5 else 'FAIL'} (worst p50 {worst_p50:.2f} ms)"
    )
    print("\nFirst call on a fresh provider process (ms; engine order Check then Diff)")
    print(f"{'call':<36}{'n':>4}{'median':>9}{'max':>9}")
    for name, v in results["first_call_ms"].items():
        print(f"{name:<36}{v['n']:>4}{v['median']:>9.2f}{v['max']:>9.2f}")
    dep = results["deploy_s"]
    print(f"\nApp deploy of {APP_FILE} on the emulator (s)")
    print(f"{'path':<34}{'n':>4}{'median':>9}{'min':>9}")
    print(
        f"{'provider Update (gRPC + runner)':<34}{dep['provider_update']['n']:>4}"
        f"{p_med:>9.3f}{dep['provider_update']['min']:>9.3f}"
    )
    print(
        f"{'raw `modal deploy`':<34}{dep['raw_modal_deploy']['n']:>4}"
        f"{r_med:>9.3f}{dep['raw_modal_deploy']['min']:>9.3f}"
    )
    ratio = dep["ratio_median"]
    print(f"ratio provider/raw: {ratio:.2f}x, target <= 1.1x: {'PASS' if ratio <= 1.1 else 'FAIL'}")
    if "gate_s" in results:
        g = results["gate_s"]
        print(f"\nHealth-gated App update of {APP_FILE} (stand-in engine, min_containers 1) (s)")
        print(f"{'measure':<44}{'n':>4}{'median':>9}{'max':>9}")
        for name in ("deploy (runner)", "new container ready after Update start",
                     "gated Update total", "gate added beyond container readiness"):  # fmt: skip
            v = g[name]
            print(f"{name:<44}{v['n']:>4}{v['median']:>9.3f}{v['max']:>9.3f}")
        added = g["gate added beyond container readiness"]["median"]
        print(f"target gate added <= 3 s: {'PASS' if added <= 3 else 'FAIL'}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.json}")
    return 0


def _gate_spec(round_: int) -> str:
    return ServingSpec.model_validate(
        {
            "engine": "vllm",
            "model": "Qwen/Qwen3-0.6B",
            "served_model_name": "qwen",
            "scaling": {"min_containers": 1, "max_containers": 1},
            "timeouts": {"startup_s": 120, "request_s": 60},
            "engine_standin": {},
            "extra_args": ["--seed", str(round_)],  # a changed spec: a new definition
        }
    ).to_json()


def _containers(emu: EmulatorProcess) -> list[dict[str, Any]]:
    return emu.containers()


def _bench_gate(emu: EmulatorProcess, eng: Engine, rounds: int) -> dict[str, Any]:
    """Gated updates; baseline = the new container's own readiness (see the docstring)."""
    from components.modal import ProxyAuthTokenProvider
    from pulumi_standin import reveal

    key = "sk-bench-gate-0123456789abcdef"
    digest = "sha256:" + __import__("hashlib").sha256(key.encode()).hexdigest()
    eng.up(  # the run's key secret (serving/app.py mounts it), now holding the gate's key
        "keys",
        SecretProvider(),
        {
            "name": "serving-api-keys",
            "environment": "main",
            "values": Secret({"SERVING_API_KEYS": json.dumps({"bench": digest})}),
        },
    )
    eng.up("gate-token", ProxyAuthTokenProvider(), {"name": "bench", "environments": ["main"]})
    tok = eng.states["gate-token"].outputs
    app, name = AppProvider(), "bench-gate"
    base = {
        "name": name,
        "environment": "main",
        "app_file": APP_FILE,
        "health_gate": True,
        "health_gate_timeout_s": 180.0,
        "gate_token_id": tok["token_id"],
        "gate_token_secret": Secret(str(reveal(tok["token_secret"]))),
        "gate_api_key": Secret(key),
        "gate_model": "qwen",
    }
    eng.up("gate-app", app, {**base, "spec_json": _gate_spec(0)})
    rows: dict[str, list[float]] = {}
    for i in range(1, rounds + 1):
        before = {c["task_id"] for c in _containers(emu)}
        t0 = time.time()
        eng.up("gate-app", app, {**base, "spec_json": _gate_spec(i)})
        t_end = time.time()
        out = eng.states["gate-app"].outputs
        assert str(out["gate_result"]).startswith("passed"), out["gate_result"]
        new = [c for c in _containers(emu) if c["task_id"] not in before and c.get("ready_at")]
        ready_at = min(float(c["ready_at"]) for c in new)
        gate_s = float(out["gate_seconds"])
        for k, v in (
            ("deploy (runner)", t_end - t0 - gate_s),
            ("new container ready after Update start", ready_at - t0),
            ("gated Update total", t_end - t0),
            ("gate added beyond container readiness", t_end - ready_at),
        ):
            rows.setdefault(k, []).append(v)
    eng.destroy("gate-app")
    return {
        k: {"n": len(v), "median": statistics.median(v), "max": max(v), "samples": v}
        for k, v in rows.items()
    }


if __name__ == "__main__":
    sys.exit(main())
