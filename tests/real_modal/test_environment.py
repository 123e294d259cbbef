"""Environment resource on real Modal: the session's throwaway environment reads back as
created and an unchanged program diffs DIFF_NONE (its create and destroy are the fixture's,
conftest.py, which also checks Modal no longer has it afterwards)."""

from __future__ import annotations

from components.modal.environment import EnvironmentProvider
from tests.real_modal.conftest import ENV_KEY, ThrowawayEnvironment
from tests.real_modal.support import REAL_MODAL, assert_diff_none

pytestmark = REAL_MODAL
P = EnvironmentProvider()


def test_environment_created_reads_back_and_diffs_none(
    throwaway_environment: ThrowawayEnvironment,
) -> None:
    env = throwaway_environment
    st = env.engine.states[ENV_KEY]
    assert st.id.startswith("en-") and st.outputs["environment_id"] == st.id
    assert st.outputs["name"] == env.name
    assert st.outputs["adopted"] is False
    suffix = st.outputs["web_suffix"]
    assert isinstance(suffix, str)  # Modal's own value: the input leaves it unmanaged
    assert env.engine.refresh(ENV_KEY) == "same"
    assert env.engine.states[ENV_KEY].outputs["web_suffix"] == suffix
    assert_diff_none(env.engine, ENV_KEY, P, env.inputs)
