"""A web process's collector (queueing/web/collector.py): frozen and with a raised
youngest-generation threshold once the application is loaded (config/wsgi.py), and left
as Python sets it with the switch off."""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from queueing.web import collector


@pytest.fixture
def _collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Calls:
    """`gc` as the collector module sees it, noting the calls it makes in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            return getattr(gc, name)(*args)
        return call


@pytest.mark.usefixtures("_collector_restored")
def test_the_web_process_freezes_what_is_loaded_and_collects_less_often(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gc.unfreeze()
    _, gen1, gen2 = gc.get_threshold()
    spy = _Calls()
    monkeypatch.setattr(collector, "gc", spy)
    assert collector.collector_setup()
    assert gc.get_freeze_count() > 1000  # Django's modules, classes and functions at least
    assert gc.get_threshold() == (collector.GEN0_THRESHOLD, gen1, gen2)
    # Collected before freezing: garbage of the start-up is not frozen with the rest.
    # (Not read off gc.get_count(): other threads of the process allocate meanwhile.)
    assert spy.calls.index("collect") < spy.calls.index("freeze"), spy.calls


@pytest.mark.usefixtures("_collector_restored")
def test_with_the_switch_off_the_collector_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    monkeypatch.setattr(collector, "TUNED", False)
    assert not collector.collector_setup()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


@pytest.mark.usefixtures("_collector_restored")
def test_the_wsgi_application_sets_up_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(collector, "collector_setup", lambda: calls.append(True) or True)
    if "config.wsgi" in sys.modules:
        importlib.reload(sys.modules["config.wsgi"])
    else:
        importlib.import_module("config.wsgi")
    assert calls == [True]
