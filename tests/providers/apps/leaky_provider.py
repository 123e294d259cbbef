"""A deliberately leaky dynamic provider: the negative control of the secret-leak scan.

Its create returns a secret input in plaintext under a new output key and prints it; the
leak scan must flag both. Never used outside tests.
"""

from typing import Any

from pulumi.dynamic import CreateResult, ResourceProvider


class LeakyProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        print(f"creating with {props['password']}")  # the leak under test
        return CreateResult("leaky-1", {"echo": props["password"]})
