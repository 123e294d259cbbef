"""Root conftest: shared fixtures live in tests/harness/ (test infrastructure, not product)."""

pytest_plugins = ["tests.harness.fixtures"]
