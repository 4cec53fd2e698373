"""Reading and tokenizing ahead on a thread: order, the bound, errors, stopping."""

import time

import pytest

from bulkembed.engine.ahead import ReadAhead


def test_items_come_in_order_and_no_further_ahead_than_the_capacity():
    produced = []

    def items():
        for number in range(10):
            produced.append(number)
            yield number

    with ReadAhead(items(), lambda n: 0.25) as ahead:
        deadline = time.monotonic() + 10
        while len(produced) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        # Four items of a quarter each fill it; the thread holds a fifth, waiting for room.
        assert produced == [0, 1, 2, 3, 4]
        assert list(ahead) == list(range(10))


def test_an_item_larger_than_the_capacity_still_goes_through_alone():
    with ReadAhead(iter([5, 6]), lambda n: 3.0) as ahead:
        assert list(ahead) == [5, 6]


def test_an_error_reaches_the_consumer_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise ValueError("line 3 is not JSON")

    with ReadAhead(items(), lambda n: 0.1) as ahead:
        found = []
        with pytest.raises(ValueError, match="line 3 is not JSON"):
            for item in ahead:
                found.append(item)
    assert found == [1, 2]


def test_leaving_early_stops_the_thread():
    def endless():
        number = 0
        while True:
            number += 1
            yield number

    with ReadAhead(endless(), lambda n: 0.5) as ahead:
        assert next(iter(ahead)) == 1
    ahead._thread.join(timeout=5)
    assert not ahead._thread.is_alive()
