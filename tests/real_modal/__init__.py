"""Tests against the real Modal control plane (marker `real_modal`), skipped unless a token is
given for them explicitly; see support.py for the variables and conftest.py for the fixtures."""
