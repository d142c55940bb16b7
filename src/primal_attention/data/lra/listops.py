"""LRA ListOps: the release files ``basic_{train,val,test}.tsv`` (:func:`load_listops_tsv`), the set
generated with LRA's rules by :mod:`~primal_attention.data.lra.listops_gen` (:func:`load_listops`,
cached), and :func:`load` / :func:`fetch`, which :func:`~primal_attention.data.lra.load_lra` and
:func:`~primal_attention.data.lra.fetch_lra` dispatch to.

Tokens: 16 ids (15 with ``tokenization="alnum"``), 0 = padding; 10 classes (the expression's value).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.cache import cache_dir
from primal_attention.data.fetch import say
from primal_attention.data.lra import listops_gen
from primal_attention.data.lra.common import (
    cache_path,
    check_split,
    example_count,
    file_key,
    load_npz,
    random_subset,
    save_npz,
    to_data,
)

__all__ = ["LISTOPS_SPLIT_SIZES", "LISTOPS_RULES", "load_listops_tsv", "load_listops", "load", "fetch"]

LISTOPS_SPLIT_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}
"""LRA's ListOps sizes."""
LISTOPS_RULES = {"min_length": 500, "max_length": 2000, "max_depth": 10, "max_args": 10}
"""LRA's ListOps generation parameters (the defaults of :func:`load_listops`)."""

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
    params = {"kind": "listops_tsv", **file_key(path)}
    cache = cache_path("listops", params)
    arrays = load_npz(cache, params)
    if arrays is None:
        try:
            arrays = _parse_listops_tsv(path)
        except UnicodeDecodeError as err:
            raise DataError(f"ListOps file {path} is not UTF-8 text (byte {err.start}: {err.reason}); "
                            "expected LRA's basic_<split>.tsv") from None
        save_npz(cache, params, **arrays)
    flat, lengths, y = arrays["ids"], arrays["lengths"], arrays["values"]
    idx = random_subset(len(y), num_examples, seed)
    if idx is not None:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        flat = np.concatenate([flat[starts[i]:starts[i] + lengths[i]] for i in idx]) if idx.size else flat[:0]
        lengths, y = lengths[idx], y[idx]
    x, mask = _encode_listops_ids(flat, lengths, seq_len, tokenization)
    return to_data(x, mask, y, num_classes=10, vocab_size=len(vocab), name="ListOps",
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
    """Generated ListOps (see :mod:`~primal_attention.data.lra.listops_gen`), cached.

    The three splits are consecutive, disjoint segments of one stream of distinct expressions (seeded
    by ``seed``): test first, then val, then train, with sizes ``split_sizes`` (default LRA's
    96000/2000/2000). So the test set never depends on the train size. ``num_examples`` takes the first
    examples of the split's segment; val and test cannot grow past their segment, train can.
    ``seq_len`` defaults to ``max_length``.
    """
    check_split(split)
    sizes = dict(LISTOPS_SPLIT_SIZES, **(split_sizes or {}))
    n = example_count(split, num_examples, sizes)
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
    return to_data(x, mask, values[offset:offset + n], num_classes=10,
                   vocab_size=len(listops_gen.VOCABS[tokenization]), name="ListOps",
                   meta={"task": "listops", "split": split, "source": "generated", "generator": gen,
                         "split_sizes": sizes, "tokenization": tokenization, "seq_len": seq_len or max_length,
                         "standin": None})


def _listops_stream(n: int, gen: dict, progress: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``n`` expressions of the stream as (concatenated ids, lengths, values), cached."""
    params = {"kind": "listops_stream", "version": 1, **gen}
    path = cache_path("listops", params)
    arrays = load_npz(path, params)
    if arrays is not None and arrays["values"].size >= n:
        lengths = arrays["lengths"][:n]
        return arrays["ids"][: int(lengths.sum())], lengths, arrays["values"][:n]
    say(progress, f"generating {n} ListOps expressions ({gen})")
    vocab = listops_gen.VOCABS["brackets"]
    stream = listops_gen.iter_expressions(**gen)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(disable=None, total=n, desc="ListOps", unit="expr")
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
    save_npz(path, params, ids=flat, lengths=lengths, values=values)
    return flat, lengths, values



def load(split: str, *, seq_len: int | None, data_dir: str | Path | None, num_examples: int | None, seed: int,
         progress: bool, **options) -> SequenceData:
    """One split for :func:`~primal_attention.data.lra.load_lra`: ``basic_<split>.tsv`` in ``data_dir`` (or in
    its ``listops-1000/``) with ``seq_len`` default 2000, or the generated set when ``data_dir`` is None."""
    common = {"num_examples": num_examples, "seed": seed}
    if data_dir is not None:
        path = Path(data_dir)
        name = f"basic_{split}.tsv"
        if not (path / name).is_file() and (path / "listops-1000" / name).is_file():
            path = path / "listops-1000"
        generator_only = sorted(set(options) - {"tokenization"})
        if generator_only:
            raise DataError(f"data.options {', '.join(generator_only)} shape the generated ListOps, not LRA's files in "
                            f"data_dir {data_dir}; remove them (or data_dir)")
        return load_listops_tsv(path / name, seq_len=seq_len or 2000, **common, **options)
    return load_listops(split, seq_len=seq_len, progress=progress, **common, **options)


def fetch(progress: bool) -> Path:
    """Generate and cache LRA's full default stream (100k expressions, seed 0); returns the cache folder."""
    _listops_stream(sum(LISTOPS_SPLIT_SIZES.values()), {"seed": 0, **LISTOPS_RULES}, progress)
    return cache_dir("lra", "listops")
