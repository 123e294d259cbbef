"""Plain functions for the runtime tests (no project code): .remote/.map/.spawn, a class,
a schedule, a volume shared across containers, secrets as env, a function that fails.

RT_FN_APP overrides the app name.
"""

import os
import time

import modal

app = modal.App(os.environ.get("RT_FN_APP", "rt-funcs"), image=modal.Image.debian_slim())
vol = modal.Volume.from_name("rt-fn-vol", create_if_missing=True)


@app.function()
def square(x: int) -> int:
    return x * x


@app.function()
def whoami() -> dict[str, str]:
    keys = ("MODAL_TASK_ID", "RT_SECRET", "MODAL_TOKEN_ID", "MODAL_IS_REMOTE")
    return {k: os.environ.get(k, "<unset>") for k in keys} | {"cwd": os.getcwd()}


@app.function(secrets=[modal.Secret.from_name("rt-secret")])
def secret_value() -> str:
    return os.environ.get("RT_SECRET", "<unset>")


@app.function()
def boom(message: str) -> None:
    raise ValueError(message)


@app.function()
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@app.function(volumes={"/vol": vol})
def write_file(name: str, text: str) -> None:
    with open(f"/vol/{name}", "w") as f:
        f.write(text)
    vol.commit()


@app.function(volumes={"/vol": vol})
def read_file(name: str) -> str:
    vol.reload()
    with open(f"/vol/{name}") as f:
        return f.read()


@app.function(schedule=modal.Period(hours=5))
def ticker() -> None:
    print(f"tick at {time.time():.3f}", flush=True)


@app.function()
def calls_other(x: int) -> int:
    return square.remote(x) + 1


@app.cls()
class Counter:
    @modal.enter()
    def setup(self) -> None:
        self.base = 100

    @modal.method()
    def add(self, n: int) -> int:
        return self.base + n

    @modal.exit()
    def bye(self) -> None:
        print("Counter exit ran", flush=True)
