"""Local emulator of Modal's control plane: the gRPC API the real `modal` client talks to.

Run it with `python -m emulator serve --port 8790` and point the client at it with
`MODAL_SERVER_URL=http://127.0.0.1:8790` (see docs/emulator.md). Layout, moto-style:

- `store.py`: the SQLite store (schema, transactions, reset, dump).
- `models/`: state and rules per area (environments, secrets, volumes, proxy tokens, apps,
  functions, images/mounts/blobs); raise `errors.EmulatorError` subclasses; no protobuf here.
- `handlers/`: gRPC methods translating protobuf messages to model calls and back.
- `http.py`: HTTP/1.1 side port: blob upload/download and the `/_emulator/*` control surface.
- `server.py` / `__main__.py`: process wiring and the command line.
"""
