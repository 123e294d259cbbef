"""A trivial `@app.server` on a fixed port, for the runtime tests (no project code).

Env knobs (read at deploy time and baked into the definition through the image's ENV):
RT_APP (app name), RT_MESSAGE (what GET / answers), RT_MIN (min_containers),
RT_MAX (max_containers), RT_CONC (max_concurrency), RT_SCALEDOWN (scaledown_window),
RT_STARTUP (startup_timeout), RT_UNAUTH=1 (unauthenticated), RT_FAIL=enter|never-listen,
RT_EXIT_MARKER=1 (`@modal.exit` writes /tmp/rt-data/exit-<task id> into the volume),
RT_DETACHED=1 (`@modal.enter` also starts a `sleep` in a new session, outside the container's
process group, and prints `detached pid <pid>`), RT_PORT (the server's port, default 8000: on
the host network a test picks a free one).
"""

import os
import pathlib

import modal

HERE = pathlib.Path(__file__).parent

APP_NAME = os.environ.get("RT_APP", "rt-server")
_env = {
    "RT_MESSAGE": os.environ.get("RT_MESSAGE", "hello"),
    "RT_FAIL": os.environ.get("RT_FAIL", ""),
    "RT_EXIT_MARKER": os.environ.get("RT_EXIT_MARKER", ""),
    "RT_DETACHED": os.environ.get("RT_DETACHED", ""),
    "RT_PORT": os.environ.get("RT_PORT", "8000"),
}
image = modal.Image.debian_slim().env(_env).add_local_file(HERE / "rt_web.py", "/root/rt_web.py")
app = modal.App(APP_NAME, image=image)
vol = modal.Volume.from_name("rt-vol", create_if_missing=True)


def _opt(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


@app.server(
    port=int(_env["RT_PORT"]),
    min_containers=_opt("RT_MIN"),
    max_containers=_opt("RT_MAX"),
    max_concurrency=_opt("RT_CONC"),
    scaledown_window=_opt("RT_SCALEDOWN"),
    startup_timeout=_opt("RT_STARTUP") or 30,
    unauthenticated=os.environ.get("RT_UNAUTH") == "1",
    volumes={"/tmp/rt-data": vol},  # a mount point under /tmp, not at / on the host
)
class Web:
    @modal.enter()
    def start(self) -> None:
        import subprocess
        import sys

        if os.environ.get("RT_FAIL") == "enter":
            raise RuntimeError("enter failed on purpose")
        if os.environ.get("RT_FAIL") == "never-listen":
            return
        if os.environ.get("RT_DETACHED") == "1":
            detached = subprocess.Popen(["sleep", "600"], start_new_session=True)
            print(f"detached pid {detached.pid}", flush=True)
        print(f"starting web server in {os.getcwd()}", flush=True)
        web = pathlib.Path(__file__).with_name("rt_web.py")  # /root/rt_web.py in a container
        self.proc = subprocess.Popen([sys.executable, str(web)])

    @modal.exit()
    def stop(self) -> None:
        print("exit hook ran", flush=True)
        if os.environ.get("RT_EXIT_MARKER") == "1":  # leaves a file in the volume
            with open(f"/tmp/rt-data/exit-{os.environ['MODAL_TASK_ID']}", "w") as f:
                f.write("exit hook ran\n")
        proc = getattr(self, "proc", None)
        if proc is not None:
            proc.terminate()
            proc.wait(5)
