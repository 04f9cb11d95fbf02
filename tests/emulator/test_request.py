"""An emulated-engine request's derived state: size, context, phase, and the seed of its greedy answer."""

from __future__ import annotations

import pytest

from calroute.emulator.request import EngineRequest, Phase


@pytest.mark.parametrize(
    ("prompt_ids", "output_ids", "phase", "context", "finished"),
    [
        ([5, 6, 7], [], Phase.WAITING, 3, False),
        ([5, 6, 7], [9, 9], Phase.RUNNING, 5, False),
        ([5], [1, 2, 3], Phase.FINISHED, 4, True),
        ([5, 6], [], Phase.PULLING, 2, False),
    ],
)
def test_derived_state(
    prompt_ids: list[int], output_ids: list[int], phase: Phase, context: int, finished: bool
) -> None:
    req = EngineRequest("r", prompt_ids, max_tokens=4, output_ids=list(output_ids), phase=phase)
    assert req.prompt_tokens == len(prompt_ids)
    assert req.context_tokens == context
    assert req.finished is finished


def test_the_answer_depends_on_the_prompt_only() -> None:
    # Greedy decoding: two requests with one prompt get one answer, whatever else differs.
    a = EngineRequest("a", [5, 6, 7], max_tokens=4)
    b = EngineRequest("b", [5, 6, 7], max_tokens=9, ignore_eos=True)
    c = EngineRequest("c", [5, 6, 8], max_tokens=4)
    assert a._seed == b._seed != c._seed
