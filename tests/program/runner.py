"""Test-facing names of the program runner; the code lives in `pulumi_standin.program`.

Runs the real Pulumi program (`__main__.py`) under the SDK's mock monitor with a stack's real
config (`stack_config`: secret-ness from the stack file's `secure:` values only, as the CLI).
"""

from pulumi_standin.program import (
    DYNAMIC,
    PROJECT,
    PROJECT_ROOT,
    STACK_TYPE,
    TEST_SECRETS,
    ProgramMocks,
    ProgramRun,
    RecordingMonitor,
    Registration,
    fake_outputs,
    project_defaults,
    run_program,
    stack_config,
    to_harness,
    to_program,
)

__all__ = [
    "DYNAMIC",
    "PROJECT",
    "PROJECT_ROOT",
    "STACK_TYPE",
    "TEST_SECRETS",
    "ProgramMocks",
    "ProgramRun",
    "RecordingMonitor",
    "Registration",
    "fake_outputs",
    "project_defaults",
    "run_program",
    "stack_config",
    "to_harness",
    "to_program",
]
