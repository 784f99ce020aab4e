"""Rule P3: one queued job's entry in the plan of the whole queue, without Django."""

from __future__ import annotations

import pickle

import pytest

from queueing.policy.explain import PlanEntry, reason_lines


def test_plan_entry_fields_are_read_by_name() -> None:
    e = PlanEntry(position=3, ahead_same_gpu_type=1, team="nlp", gpu_type="a100",
                  wait_code="quota", wait_message="over quota")
    assert (e.position, e.ahead, e.ahead_same_gpu_type) == (3, 2, 1)
    assert (e.team, e.gpu_type, e.wait_code, e.wait_message) == ("nlp", "a100", "quota",
                                                                  "over quota")
    assert not e.admitted_next


@pytest.mark.parametrize(("code", "message"), [
    ("next_cycle", ""), ("capacity", "no a100 GPUs free"), ("quota", ""), ("", ""),
])
@pytest.mark.parametrize("position", [1, 4])
def test_plan_entry_reasons_are_rule_p3_reason_lines(code: str, message: str,
                                                      position: int) -> None:
    e = PlanEntry(position, 1 if position > 1 else 0, "vision", "h100", code, message)
    assert e.reasons() == reason_lines(
        ahead=position - 1, ahead_same_gpu_type=e.ahead_same_gpu_type, gpu_type="h100",
        wait_code=code or None, wait_message=message or None,
        admitted_next=code == "next_cycle")


def test_plan_entry_survives_the_cache_pickle() -> None:
    entries = {7: PlanEntry(1, 0, "speech", "a100", "next_cycle", "")}
    back = pickle.loads(pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == entries and type(back[7]) is PlanEntry
