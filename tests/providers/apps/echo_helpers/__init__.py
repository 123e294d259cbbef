"""Helper package shipped by the echo test app (`add_local_python_source`): its content is part
of the App resource's source digest."""

GREETING = "hello from the echo app"


def describe(spec: dict[str, object]) -> dict[str, object]:
    """What the endpoint answers: the greeting and the served model name from the spec."""
    return {"greeting": GREETING, "model": spec.get("served_model_name")}
