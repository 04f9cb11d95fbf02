"""splitmix64: the published generator, and the pinned outputs of the two shift sets in use."""

from __future__ import annotations

import numpy as np
import pytest

from calroute.splitmix import GOLDEN, HASH_SHIFTS, MASK64, hash64, mix64, splitmix64


def test_the_generator_is_splitmix64() -> None:
    # The reference implementation's first outputs from seed 0 (Vigna's splitmix64.c).
    assert splitmix64(np.arange(3, dtype=np.uint64)).tolist() == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]
    # Output number c of the generator seeded with s is output number 0 of the one seeded with s + c * GOLDEN.
    counters = np.arange(5, dtype=np.uint64)
    np.testing.assert_array_equal(
        splitmix64(counters, 12345), splitmix64(np.zeros(5, np.uint64), 12345 + counters * np.uint64(GOLDEN))
    )


@pytest.mark.parametrize("shifts", [(30, 27, 31), HASH_SHIFTS])
def test_ints_and_arrays_mix_alike(shifts: tuple[int, int, int]) -> None:
    xs = [0, 1, 2**63, MASK64, 0x0123456789ABCDEF]
    assert mix64(np.array(xs, dtype=np.uint64), shifts).tolist() == [mix64(x, shifts) for x in xs]


def test_fixed_values_do_not_drift() -> None:
    # Pinned from the three mixers this module replaced: the random policies' picks (hash64 from GOLDEN),
    # the emulator's greedy tokens (one value folded into a prompt's seed) and the prompts' stream.
    assert hash64() == GOLDEN
    assert hash64(1) == 3843862592184124760
    assert hash64(1, 2, 3) == 12137764019763327488
    assert hash64(-1, 5) == 2221673461379565525  # a value counts as its low 64 bits
    assert hash64(2, state=1) == 522839193244061881
    assert [mix64(x) for x in (0, 1, MASK64)] == [0, 6238072747940578789, 13029008266876403067]


def test_hash64_is_deterministic_and_spreads() -> None:
    assert hash64(1, 2, 3) == hash64(1, 2, 3)
    assert len({hash64(0, s, 1) % 4 for s in range(64)}) == 4
    assert hash64(1, 2) != hash64(2, 1)
