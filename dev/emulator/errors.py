"""Errors raised by the emulator's models; handlers map each class to one gRPC status.

Messages name the resource, what was asked and what to do next; they never contain a secret
value.
"""

from __future__ import annotations


class EmulatorError(Exception):
    """Base class: a request the emulator refuses, with a client-facing message."""

    status_name = "INTERNAL"


class NotFound(EmulatorError):
    """The named or identified resource does not exist (gRPC NOT_FOUND)."""

    status_name = "NOT_FOUND"


class AlreadyExists(EmulatorError):
    """A resource with that name already exists (gRPC ALREADY_EXISTS)."""

    status_name = "ALREADY_EXISTS"


class InvalidArgument(EmulatorError):
    """Malformed name, id or field (gRPC INVALID_ARGUMENT)."""

    status_name = "INVALID_ARGUMENT"


class FailedPrecondition(EmulatorError):
    """The request is well formed but the current state forbids it (gRPC FAILED_PRECONDITION)."""

    status_name = "FAILED_PRECONDITION"


class PermissionDenied(EmulatorError):
    """The caller is authenticated but its role does not allow the call (PERMISSION_DENIED)."""

    status_name = "PERMISSION_DENIED"
