"""Web endpoints that run as inputs, for the runtime tests (no project code):
`@modal.fastapi_endpoint`, `@modal.asgi_app`, `@modal.web_server`, a class web method."""

import modal

app = modal.App("rt-endpoints", image=modal.Image.debian_slim())


@app.function()
@modal.fastapi_endpoint(method="POST", requires_proxy_auth=True)
def add(item: dict[str, int]) -> dict[str, int]:
    return {"sum": item["a"] + item["b"]}


@app.function()
@modal.fastapi_endpoint()
def hello(name: str = "world") -> str:
    return f"hello {name}"


@app.function()
@modal.asgi_app()
def api() -> object:
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    web = FastAPI()

    @web.get("/items/{n}")
    def item(n: int) -> dict[str, int]:
        return {"n": n, "double": 2 * n}

    @web.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        body = await request.body()
        return {"size": len(body)}

    @web.get("/stream")
    def stream() -> StreamingResponse:
        return StreamingResponse(iter([b"a\n", b"b\n", b"c\n"]), media_type="text/plain")

    return web


@app.function()
@modal.web_server(port=8080, startup_timeout=30)
def files() -> None:
    import subprocess

    # Modal reaches it on the container's external interface: listen on 0.0.0.0.
    subprocess.Popen(["python", "-m", "http.server", "8080", "--bind", "0.0.0.0"])


@app.cls()
class Greeter:
    @modal.fastapi_endpoint()
    def greet(self, who: str = "you") -> str:
        return f"greetings, {who}"
