"""`WriteBehind`: items written in order on a thread, errors raised in the caller."""

import threading
import time

import pytest

from bulkembed.engine.writer import WriteBehind


def test_items_are_written_in_order_on_another_thread_and_finish_waits_for_them():
    written, threads = [], set()

    def write(item):
        for step in range(3):
            time.sleep(0.001)
            written.append((item, step))
            threads.add(threading.current_thread().name)
            yield

    with WriteBehind(write) as behind:
        for item in range(5):
            behind.submit(item)
        behind.finish()
        assert written == [(item, step) for item in range(5) for step in range(3)]
    assert threads == {"bulkembed-writer"}


def test_one_item_is_in_hand_at_a_time():
    release = threading.Event()
    started = []

    def write(item):
        started.append(item)
        if item == 0:
            release.wait(5)
        yield

    with WriteBehind(write) as behind:
        behind.submit(0)
        submitted = threading.Thread(target=behind.submit, args=(1,))
        submitted.start()
        submitted.join(0.2)
        assert submitted.is_alive() and started == [0]  # item 1 waits for item 0
        release.set()
        submitted.join(5)
        behind.finish()
    assert started == [0, 1]


def test_an_error_in_the_writer_is_raised_in_the_caller_at_the_next_submit():
    def write(item):
        if item == 1:
            raise OSError(28, "No space left on device")
        yield

    with pytest.raises(OSError, match="No space left"), WriteBehind(write) as behind:
        behind.submit(0)
        behind.submit(1)
        behind.submit(2)


def test_an_error_in_the_writer_is_raised_at_finish():
    def write(item):
        yield
        raise ValueError(f"bad item {item}")

    with pytest.raises(ValueError, match="bad item 0"), WriteBehind(write) as behind:
        behind.submit(0)
        behind.finish()


def test_leaving_on_an_error_stops_the_thread_between_steps():
    steps = []
    entered = threading.Event()

    def write(item):
        for step in range(1000):
            steps.append(step)
            entered.set()
            time.sleep(0.001)
            yield

    behind = WriteBehind(write)
    with pytest.raises(KeyboardInterrupt), behind:
        behind.submit(0)
        entered.wait(5)
        raise KeyboardInterrupt
    assert "bulkembed-writer" not in {t.name for t in threading.enumerate()}
    assert 0 < len(steps) < 1000


def test_leaf_paths_are_the_columns_pyarrow_writes():
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bulkembed.sinks.part_files import leaf_paths

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("dense", pa.list_(pa.float32(), 4)),
            ("sparse", pa.struct([("indices", pa.list_(pa.int32()))])),
            ("multivector", pa.list_(pa.list_(pa.float16(), 4))),
            ("meta", pa.struct([("a", pa.int64()), ("m", pa.map_(pa.string(), pa.int8()))])),
            ("tags", pa.large_list(pa.string())),
            ("kind", pa.dictionary(pa.int32(), pa.string())),
        ]
    )
    buffer = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), buffer)
    written = pq.ParquetFile(pa.BufferReader(buffer.getvalue())).schema
    expected = [written.column(i).path for i in range(len(written))]
    assert [p for f in schema for p in leaf_paths(f.name, f.type)] == expected


def test_a_dead_writer_s_temporary_parts_are_removed_and_nothing_else(tmp_path):
    from bulkembed.sinks.parquet import ParquetSink

    dead = tmp_path / ".part-00000-000000.4242-a1b2c3.parquet.tmp"
    alive = tmp_path / ".part-00000-000001.4243-a1b2c3.parquet.tmp"
    foreign = tmp_path / ".notes.4242-a1b2c3.parquet.tmp"
    for path in (dead, alive, foreign):
        path.write_bytes(b"x")
    ParquetSink(tmp_path).abandon([4242])
    assert sorted(p.name for p in tmp_path.iterdir()) == [foreign.name, alive.name]
