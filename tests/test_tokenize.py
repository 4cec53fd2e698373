import multiprocessing
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pytest
from helpers import sample_texts

from bulkembed.batching.tokenize import TextTokenizer, TokenizerPool, TokenizerSettings
from bulkembed.errors import WorkerError
from bulkembed.sources import Chunk, IdKey


def _settings(folder, max_length=32, prompt="", lowercase=False) -> TokenizerSettings:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return TokenizerSettings(tokenizer.backend_tokenizer.to_str(), max_length, prompt, lowercase)


def _chunks(texts, size):
    for start in range(0, len(texts), size):
        part = texts[start : start + size]
        ids = pa.array([str(start + i) for i in range(len(part))])
        yield Chunk(0, 0, ids, pa.array(part, pa.string()), False)


def test_ids_match_the_transformers_tokenizer_with_truncation(minilm):
    from transformers import AutoTokenizer

    texts = sample_texts(200)
    reference = AutoTokenizer.from_pretrained(minilm)
    truncated_ids = reference(texts, truncation=True, max_length=64)["input_ids"]
    full_ids = reference(texts)["input_ids"]
    flat, lengths, truncated = TextTokenizer(_settings(minilm, max_length=64))(texts)
    ours = np.split(flat, np.cumsum(lengths)[:-1])
    assert [o.tolist() for o in ours] == truncated_ids
    assert truncated.tolist() == [len(ids) > 64 for ids in full_ids] and truncated.any()


def test_prompt_and_lowercase_are_applied_before_tokenizing(minilm):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(minilm)("passage: hello world")["input_ids"]
    flat, lengths, _ = TextTokenizer(_settings(minilm, 64, "passage: ", lowercase=True))(
        ["Hello WORLD"]
    )
    assert flat.tolist() == reference and lengths.tolist() == [len(reference)]


@pytest.mark.parametrize("workers", [0, 2])
def test_pool_returns_chunks_in_order(tiny_bert, workers):
    texts = sample_texts(300)
    settings = _settings(tiny_bert)
    expected = TextTokenizer(settings)(texts)
    key = IdKey.fresh()
    with TokenizerPool(settings, workers, key, max_in_flight=3) as pool:
        results = list(pool.map(_chunks(texts, 7)))
    assert [r.chunk.ids[0].as_py() for r in results] == [str(i) for i in range(0, 300, 7)]
    np.testing.assert_array_equal(np.concatenate([r.token_ids for r in results]), expected[0])
    np.testing.assert_array_equal(np.concatenate([r.lengths for r in results]), expected[1])
    # Each text's content hash and each id's hash come back with the tokens.
    from helpers import content_hash

    hashes = np.concatenate([r.chunk.hashes for r in results])
    # (as bytes, not items: an item of an S16 array loses its trailing zero bytes)
    assert [bytes(h).hex() for h in hashes.view(np.uint8).reshape(-1, 16)] == [
        content_hash(t) for t in texts
    ]
    ids = np.concatenate([r.chunk.id_hashes for r in results])
    assert ids.tolist() == key.hashes(pa.array([str(i) for i in range(300)])).tolist()


def test_a_tokenized_chunk_leaves_its_texts_behind(tiny_bert):
    import pickle

    texts = sample_texts(200)
    # The chunk's texts a slice of a larger array, as a row group's are.
    whole = pa.array(texts * 4, pa.string())
    chunk = Chunk(0, 0, pa.array([str(i) for i in range(200)]), whole.slice(200, 200), False)
    with TokenizerPool(_settings(tiny_bert), 0, IdKey.fresh()) as pool:
        (tokenized,) = pool.map([chunk])
    assert len(tokenized.chunk.texts) == 0
    # What a device process is sent holds no byte of the texts.
    assert len(pickle.dumps(tokenized.chunk.texts)) < 1000 < whole.nbytes // 100


def test_dead_worker_is_an_error_not_a_hang(tiny_bert):
    texts = sample_texts(50)
    with TokenizerPool(_settings(tiny_bert), 1, IdKey.fresh(), max_in_flight=2) as pool:
        results = pool.map(_chunks(texts * 200, 5))
        next(results)
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="tokenizer worker process died"):
            for _ in results:
                pass


def test_a_stuck_worker_times_out_and_is_killed(tiny_bert, monkeypatch):
    monkeypatch.setattr("bulkembed.batching.tokenize.RESULT_TIMEOUT_SECONDS", 2)
    texts = sample_texts(50)
    started = time.monotonic()
    late = "tokenizer on process 0 took more than 2 s for one chunk"
    with pytest.raises(WorkerError, match=late):  # noqa: SIM117
        with TokenizerPool(_settings(tiny_bert), 1, IdKey.fresh(), max_in_flight=2) as pool:
            results = pool.map(_chunks(texts * 200, 5))
            next(results)
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGSTOP)
            for _ in results:
                pass
    assert time.monotonic() - started < 30
    time.sleep(0.5)
    assert multiprocessing.active_children() == []


def test_workers_left_with_unread_results_are_stopped_at_once(tiny_bert, monkeypatch):
    # A run that stops reading (`--limit` reached) leaves results no one takes: the workers
    # are not waited for, which would last until the stop timeout.
    monkeypatch.setattr("bulkembed.workers.STOP_SECONDS", 120.0)
    texts = sample_texts(50)
    with TokenizerPool(_settings(tiny_bert), 1, IdKey.fresh(), max_in_flight=8) as pool:
        results = pool.map(_chunks(texts * 400, 500))
        next(results)
        workers = multiprocessing.active_children()
        started = time.monotonic()
    for worker in workers:
        worker.join()
    assert [w.exitcode for w in workers] == [-signal.SIGKILL] * len(workers)
    assert time.monotonic() - started < 60


def test_workers_that_handed_over_every_result_stop_on_their_own(tiny_bert):
    with TokenizerPool(_settings(tiny_bert), 1, IdKey.fresh(), max_in_flight=2) as pool:
        assert sum(len(t.lengths) for t in pool.map(_chunks(sample_texts(50), 5))) == 50
        workers = multiprocessing.active_children()
    assert [w.exitcode for w in workers] == [0] * len(workers)
