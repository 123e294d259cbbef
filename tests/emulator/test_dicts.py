"""modal.Dict through the real SDK: the minimal Dict RPCs the spend watcher uses.

Kept (issue 33 item 7): the spend watcher keeps its state in a named Dict
(watchers/spend_alerts.py); modal 1.6.4 modal/dict.py `_Dict.from_name`, `get`, `put`.
"""

from __future__ import annotations

import modal
import pytest
from modal.exception import NotFoundError

from tests.harness.emulator import EmulatorProcess


def test_a_named_dict_keeps_values_per_environment(modal_env: EmulatorProcess) -> None:
    with pytest.raises(NotFoundError, match="'alerts' not found"):
        modal.Dict.from_name("alerts").hydrate()
    d = modal.Dict.from_name("alerts", create_if_missing=True)
    assert d.get("sent") is None and "sent" not in d
    d["sent"] = {"0.5": 1.0}
    assert d.put("sent", [], skip_if_exists=True) is False  # kept
    assert modal.Dict.from_name("alerts").get("sent") == {"0.5": 1.0}  # same Dict, by name
    d.update(other=2)
    assert d.len() == 2 and d.pop("other") == 2 and d.len() == 1
    d.clear()
    assert d.len() == 0
    modal_env.reset()
    with pytest.raises(NotFoundError):
        modal.Dict.from_name("alerts").hydrate()
