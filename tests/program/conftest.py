"""Fixtures of the gateway tests: the Modal side of the chain (tests/program/gateway_chain.py)."""

from tests.program.gateway_chain import modal_side, processes

__all__ = ["modal_side", "processes"]
