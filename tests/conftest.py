"""Root conftest: shared fixtures live in tests/harness/ (test infrastructure, not product)."""

import os

pytest_plugins = ["tests.harness.fixtures"]

# The program asks the Hugging Face hub whether a service's model exists (components/
# model_name.py). The suite never depends on the network: by default the hub is a port that
# refuses at once (the "model name not checked" line), on a machine with internet too; a test
# that means a hub sets HF_ENDPOINT itself (a local fake hub or weights server).
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
