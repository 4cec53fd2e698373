"""Build a real-text, length-skewed corpus from the documentation that ships with Python.

Documents are, in a fixed order: every topic of the Python reference manual bundled as
`pydoc_data.topics` (long: hundreds to thousands of words), each of its paragraphs (a line
to a few hundred words), and the docstrings of a fixed list of standard-library modules,
their classes and functions (a few words to a few thousand). Duplicates are dropped.

    python benchmarks/corpus.py --docs 2000 --out corpus/ [--files 4] [--format parquet]
    python benchmarks/corpus.py --docs 2000 --copies 10 --out big/   # 10x, distinct ids

The text depends on the Python version that runs this script (it reads its own docs).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

_MODULE_NAMES = """
argparse asyncio base64 bisect calendar collections concurrent.futures configparser
contextlib copy csv dataclasses datetime decimal difflib email enum fractions functools gzip
hashlib heapq hmac html http.client http.server imaplib inspect io ipaddress itertools json
logging mailbox math mimetypes numbers operator optparse os pathlib pickle pprint queue
random re sched secrets selectors shlex shutil smtplib socket sqlite3 ssl statistics string
struct subprocess tarfile tempfile textwrap threading time timeit tokenize traceback typing
unittest urllib.parse urllib.request uuid warnings weakref xml.dom.minidom
xml.etree.ElementTree zipfile zlib abc array ast asyncio.events asyncio.streams
asyncio.tasks cProfile cmd code codecs contextvars copyreg dbm dis doctest email.message
email.policy email.utils filecmp fnmatch ftplib gettext glob graphlib http.cookiejar
http.cookies importlib.metadata importlib.resources linecache locale multiprocessing netrc
pdb pkgutil platform plistlib poplib profile pstats runpy shelve signal socketserver stat
sysconfig tomllib trace tracemalloc types unittest.mock urllib.robotparser wave
wsgiref.simple_server xml.sax xmlrpc.client zipimport zoneinfo
"""
MODULES = _MODULE_NAMES.split()


def _reference_topics() -> Iterator[str]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield topics[name].strip()


def _paragraphs() -> Iterator[str]:
    for topic in _reference_topics():
        for paragraph in re.split(r"\n\s*\n", topic):
            text = " ".join(paragraph.split())
            if text:
                yield text


def _docstrings() -> Iterator[str]:
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        objects = [module]
        for _, member in sorted(vars(module).items()):
            if getattr(member, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(member):
                objects.append(member)
                objects.extend(m for _, m in sorted(vars(member).items()) if callable(m))
            elif callable(member):
                objects.append(member)
        for obj in objects:
            doc = inspect.getdoc(obj)
            if doc:
                yield doc.strip()


def documents() -> Iterator[str]:
    """Every distinct document, interleaving the three sources so lengths are mixed."""
    seen: set[str] = set()
    sources = [_reference_topics(), _paragraphs(), _docstrings()]
    while sources:
        for source in list(sources):
            text = next(source, None)
            if text is None:
                sources.remove(source)
            elif text not in seen:
                seen.add(text)
                yield text


def build(docs: int, copies: int = 1) -> list[dict[str, str]]:
    """`docs` documents (fewer if Python's docs run out), repeated `copies` times, ids unique."""
    texts = []
    for text in documents():
        texts.append(text)
        if len(texts) == docs:
            break
    return [
        {"id": f"doc-{copy:02d}-{i:06d}", "text": text}
        for copy in range(copies)
        for i, text in enumerate(texts)
    ]


def write(records: list[dict[str, str]], out: Path, files: int, fmt: str) -> list[Path]:
    """Split records into `files` files of `fmt` (jsonl or parquet) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    size = -(-len(records) // files)
    paths = []
    for number in range(files):
        part = records[number * size : (number + 1) * size]
        path = out / f"input-{number:03d}.{fmt}"
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(part), path, row_group_size=1000)
        else:
            with open(path, "w", encoding="utf-8") as f:
                for record in part:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records = build(args.docs, args.copies)
    paths = write(records, args.out, args.files, args.format)
    words = [len(r["text"].split()) for r in records]
    print(
        json.dumps(
            {
                "docs": len(records),
                "files": [str(p) for p in paths],
                "words_min": min(words),
                "words_median": sorted(words)[len(words) // 2],
                "words_max": max(words),
            }
        )
    )


if __name__ == "__main__":
    main()
