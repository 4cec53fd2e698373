import numpy as np
import pytest

from bulkembed.batching.packing import input_order, pack_batches


def _random_lengths(seed: int, n: int = 2000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Length-skewed like real corpora: most short, a long tail, some past the budget.
    return np.minimum(rng.lognormal(3.0, 1.2, n).astype(int) + 1, 40000)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [512, 4096, 16384])
def test_padded_budget_is_never_exceeded_except_by_a_lone_long_document(seed, budget):
    lengths = _random_lengths(seed)
    batches = pack_batches(lengths, budget)
    for batch in batches:
        assert batch.padded_tokens <= budget or (batch.size == 1 and batch.lengths[0] > budget)
        assert batch.lengths[0] == batch.lengths.max()
        np.testing.assert_array_equal(batch.lengths, lengths[batch.indices])
    over_long = int((lengths > budget).sum())
    assert sum(1 for b in batches if b.padded_tokens > budget) == over_long


@pytest.mark.parametrize("padded", [True, False])
def test_every_document_lands_in_exactly_one_batch(padded):
    lengths = _random_lengths(7)
    batches = pack_batches(lengths, 2048, padded=padded)
    seen = np.concatenate([b.indices for b in batches])
    assert sorted(seen.tolist()) == list(range(len(lengths)))


def test_unpadded_batches_fill_up_to_the_budget_in_real_tokens():
    batches = pack_batches([100] * 10 + [30] * 10, 350, padded=False)
    assert [b.tokens for b in batches] == [300, 300, 300, 100 + 8 * 30, 2 * 30]
    assert all(b.tokens <= 350 for b in batches)


def test_docstring_example_counts():
    sizes = [b.size for b in pack_batches([128] * 256 + [512] * 32, 16384)]
    assert sizes == [32, 128, 128]


def test_short_documents_are_not_padded_to_a_much_longer_one():
    batches = pack_batches([40] * 300 + [5] * 300, 16384)
    assert [(b.size, int(b.lengths[0]), int(b.lengths[-1])) for b in batches] == [
        (300, 40, 40),
        (300, 5, 5),
    ]
    assert all(b.tokens == b.padded_tokens for b in batches)


def test_a_large_batch_overhead_keeps_documents_together_despite_padding():
    batches = pack_batches([10, 5], 1000, batch_overhead_tokens=1000)
    assert [(b.tokens, b.padded_tokens) for b in batches] == [(15, 20)]
    apart = pack_batches([10, 5], 1000, batch_overhead_tokens=0)
    assert [(b.tokens, b.padded_tokens) for b in apart] == [(10, 10), (5, 5)]


def test_input_order_puts_outputs_back_in_window_order():
    lengths = _random_lengths(3, 500)
    batches = pack_batches(lengths, 1024)
    # Each "output" row is its document's own length: reordering must give back `lengths`.
    outputs = np.concatenate([b.lengths for b in batches])
    np.testing.assert_array_equal(outputs[input_order(batches)], lengths)


def test_empty_window_gives_no_batch():
    assert pack_batches([], 100) == []


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        pack_batches([1], 0)


def test_a_chunk_larger_than_a_window_is_cut_and_keeps_its_unit_end():
    import pyarrow as pa

    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.batching.windows import windows
    from bulkembed.sources import BadRecord, Chunk

    lengths = np.array([5, 5, 5, 5, 5, 5, 5], dtype=np.int32)
    chunk = Chunk(
        0, 3, pa.array(list("abcdefg")), pa.array([], pa.string()), True, [BadRecord("f", "bad")]
    )
    chunk.positions = np.arange(7)
    truncated = np.array([True, False, False, False, False, True, False])
    tokenized = TokenizedChunk(chunk, np.arange(35, dtype=np.int32), lengths, truncated)
    pieces = [piece for window in windows(iter([tokenized]), 12) for piece in window]
    assert [p.chunk.ids.to_pylist() for p in pieces] == [["a", "b"], ["c", "d"], ["e", "f"], ["g"]]
    assert [p.chunk.last_in_unit for p in pieces] == [False, False, False, True]
    assert [len(p.chunk.bad) for p in pieces] == [1, 0, 0, 0]
    assert [p.truncated for p in pieces] == [1, 0, 1, 0]
    assert np.concatenate([p.token_ids for p in pieces]).tolist() == list(range(35))
    assert all(p.lengths.sum() <= 12 for p in pieces)


def test_multivector_windows_are_bounded_by_bytes():
    from bulkembed.batching.windows import MULTIVECTOR_WINDOW_BYTES, window_tokens

    assert window_tokens(16384, None) == 32 * 16384
    assert window_tokens(16384, 1024) * 1024 * 4 == MULTIVECTOR_WINDOW_BYTES
    assert window_tokens(16384, 128) == 32 * 16384


def _carried_chunk(unit, positions, embedded=()):
    """A chunk whose records at `positions` are carried over with one 1 kB vector each, and
    whose records at `embedded` are to embed (5 tokens each)."""
    import pyarrow as pa

    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.contracts import RowCounts
    from bulkembed.sources import Chunk
    from bulkembed.sources.records import Carried

    def rows(where):
        chunk = Chunk(0, unit, pa.array([f"d{p}" for p in where]), pa.array([], pa.string()), False)
        chunk.positions = np.array(where, dtype=np.int64)
        return chunk

    chunk = rows(embedded)
    chunk.last_in_unit = True
    vectors = pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(256 * len(positions), np.float32)), 256
    )
    # Each carried record counts its position plus 10 tokens, so that a split shows.
    counts = RowCounts(np.array(positions, np.int32) + 10, np.zeros(len(positions), bool))
    chunk.carried = Carried(rows(positions), pa.table({"dense": vectors}), counts)
    lengths = np.full(len(embedded), 5, dtype=np.int32)
    truncated = np.zeros(len(embedded), bool)
    return TokenizedChunk(chunk, np.zeros(int(lengths.sum()), np.int32), lengths, truncated)


def test_windows_close_on_carried_bytes_too(monkeypatch):
    from bulkembed.batching import windows as module

    monkeypatch.setattr(module, "CARRIED_WINDOW_BYTES", 4096)  # two 2 kB chunks
    chunks = [_carried_chunk(unit, [0, 1]) for unit in range(5)]
    sizes = [len(window) for window in module.windows(iter(chunks), 1_000_000)]
    assert sizes == [2, 2, 1]


def test_carried_records_go_with_the_piece_they_precede():
    from bulkembed.batching.windows import split_chunk

    tokenized = _carried_chunk(0, [0, 3, 4, 9], embedded=[1, 2, 5, 6, 7, 8])
    pieces = split_chunk(tokenized, 10)
    assert [p.chunk.positions.tolist() for p in pieces] == [[1, 2], [5, 6], [7, 8]]
    carried = [p.chunk.carried and p.chunk.carried.records.positions.tolist() for p in pieces]
    assert carried == [[0, 3, 4], None, [9]]
    assert [p.chunk.carried.embeddings.num_rows for p in pieces if p.chunk.carried] == [3, 1]
    counts = [p.chunk.carried.counts.tokens.tolist() for p in pieces if p.chunk.carried]
    assert counts == [[10, 13, 14], [19]]


def test_device_idle_fraction_is_the_time_outside_the_model_after_start_up():
    import time

    from bulkembed.reporting.progress import RunStats

    now = time.monotonic()
    stats = RunStats(started=now - 30.0, embedding=now - 10.0, encode_seconds=7.5)
    assert abs(stats.device_idle_fraction - 0.25) < 0.01
    assert abs(stats.startup_seconds - 20.0) < 1e-9 and stats.seconds >= 30.0
    stats = RunStats(started=now - 1.0, embedding=now - 1.0, encode_seconds=5.0)
    assert stats.device_idle_fraction == 0
    # Before the first batch: no start-up measured yet, and no rate.
    assert (RunStats().startup_seconds, RunStats(docs=5).docs_per_s) == (None, 0.0)


def test_device_busy_fraction_is_the_gpu_time_timed_by_cuda_events_over_the_embedding_time():
    import time

    from bulkembed.contracts import DeviceCounts
    from bulkembed.reporting.progress import RunStats

    now = time.monotonic()
    # A CPU run times nothing with CUDA events: no figure rather than 0.
    assert RunStats(started=now - 30.0, embedding=now - 10.0).device_busy_fraction is None
    gpu = RunStats(started=now - 30.0, embedding=now - 10.0, counts=DeviceCounts(0, 9.0))
    assert abs(gpu.device_busy_fraction - 0.9) < 0.01
    # Two devices side by side: each unit's seconds count as the mean device's.
    total = RunStats(started=now - 30.0, embedding=now - 10.0)
    for _ in range(2):
        total.add(RunStats(counts=DeviceCounts(1, 8.0)), share=1 / 2)
    assert total.counts.float32_retries == 2 and abs(total.device_busy_fraction - 0.8) < 0.01
