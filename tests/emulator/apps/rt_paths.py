"""Paths a container sees that do not exist on the machine, for issue 22 item 8 (no project
code): a volume at a new top-level directory, a volume under a directory the machine has
(not /tmp, not /root), and an image file copied to a new top-level directory.

Env knobs, read at deploy time and baked into the image's ENV: RT_VOL_TOP, RT_VOL_NESTED,
RT_IMG_PATH (absolute paths).
"""

import os
import pathlib

import modal

HERE = pathlib.Path(__file__).parent
TOP = os.environ.get("RT_VOL_TOP", "/rt-paths-top")
NESTED = os.environ.get("RT_VOL_NESTED", "/opt/rt-paths-nested/data")
IMG = os.environ.get("RT_IMG_PATH", "/rt-paths-img/hello.txt")

image = (
    modal.Image.debian_slim()
    .env({"RT_VOL_TOP": TOP, "RT_VOL_NESTED": NESTED, "RT_IMG_PATH": IMG})
    .add_local_file(HERE / "server_config.json", IMG, copy=True)
)
app = modal.App("rt-paths", image=image)
top = modal.Volume.from_name("rt-paths-top", create_if_missing=True)
nested = modal.Volume.from_name("rt-paths-nested", create_if_missing=True)


@app.function(volumes={TOP: top, NESTED: nested})
def probe(token: str) -> dict[str, str]:
    """Writes `token` into both volumes; answers what the container saw."""
    for where in (os.environ["RT_VOL_TOP"], os.environ["RT_VOL_NESTED"]):
        with open(os.path.join(where, "token.txt"), "w") as f:
            f.write(token)
    with open(os.environ["RT_IMG_PATH"]) as f:
        image_file = f.read()
    return {"image_file": image_file, "cwd": os.getcwd()}
