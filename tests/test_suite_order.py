"""The order the tier hands its tests to pytest-xdist's workers (``tests/conftest.py``)."""

import pytest

from tests.conftest import stories_first


def _shares(ordered: list[int], workers: int) -> list[list[int]]:
    """The contiguous shares ``--dist worksteal`` first gives each worker: what is left, split among the
    workers left."""
    shares, left, start = [], len(ordered), 0
    for index in range(workers):
        size = left // (workers - index)
        shares.append(ordered[start : start + size])
        start, left = start + size, left - size
    return shares


@pytest.mark.parametrize(("count", "every", "workers"), [(1557, 14, 4), (1557, 14, 3), (20, 5, 2), (9, 3, 4)])
def test_every_worker_starts_on_its_part_of_the_long_tests(count: int, every: int, workers: int) -> None:
    items = list(range(count))
    long = [item % every == 0 for item in items]
    ordered = stories_first(items, long, workers)
    assert sorted(ordered) == items  # the same tests, each once
    stories = [item for item in items if long[item]]
    for index, share in enumerate(_shares(ordered, workers)):
        mine = stories[index::workers]
        assert share[: len(mine)] == mine  # its long tests first, in the collection's order
        assert not any(long[item] for item in share[len(mine) :])


def test_one_process_runs_the_long_tests_first() -> None:
    assert stories_first(list(range(6)), [False, True, False, False, True, False], 1) == [1, 4, 0, 2, 3, 5]
