"""The ledger's snapshot on object storage at scale: a restart among 10,000 done units
reads the snapshot and the markers written since it, and nothing else but the listing."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from bulkembed.contracts import UnitRecord
from bulkembed.run_dir.ledger import SNAPSHOT_EVERY, Ledger
from bulkembed.storage import location

UNITS = 10_000
# Markers written after the last snapshot a run wrote (it writes one every SNAPSHOT_EVERY).
SINCE = 7


def _record(number: int) -> UnitRecord:
    part = f"part-{number // 1000:05d}-{number % 1000:06d}"
    return UnitRecord(part, rows=100, bad_records=0, truncated=1, tokens=900, padded_tokens=990)


@pytest.mark.slow
def test_a_restart_among_10000_units_on_s3_reads_the_snapshot_and_the_markers_since(s3):
    meta = location(s3.uri("big")) / "_bulkembed"
    before = [_record(n) for n in range(UNITS - SINCE)]
    assert len(before) % SNAPSHOT_EVERY == SNAPSHOT_EVERY - SINCE
    # The markers a run wrote before its last snapshot, many at a time, then that snapshot.
    writer = Ledger(meta, periodic=False)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda record: writer.mark_done(record, []), before))
    writer.write_snapshot()
    writer.periodic = True
    for number in range(UNITS - SINCE, UNITS):
        writer.mark_done(_record(number), [])

    start = s3.server.log.stat().st_size
    done, damaged = Ledger(meta).units()
    requests = s3.server.requests(start)

    assert damaged == [] and sorted(done) == sorted(_record(n).part for n in range(UNITS))
    assert done[_record(UNITS - 1).part] == _record(UNITS - 1)
    listings = [r for r in requests if r.startswith(f"GET /{s3.name}?")]
    objects = [r.split(" ", 1) for r in requests if r not in listings]
    assert {method for method, _ in objects} == {"HEAD", "GET"}
    markers = [
        f"/{s3.name}/big/_bulkembed/done/{_record(n).part}.json"
        for n in range(UNITS - SINCE, UNITS)
    ]
    # The snapshot and the markers written since it, each read once (a HEAD, then the
    # object in one or a few ranged GETs); one listing of the markers, 1,000 keys a page.
    assert {key for _, key in objects} == {f"/{s3.name}/big/_bulkembed/ledger.json", *markers}
    assert sum(method == "HEAD" for method, _ in objects) == 1 + SINCE
    assert len(listings) == UNITS // 1000
