"""LM data: the split by work, the byte-level BPE, token blocks and byte counts (tiny in-memory corpora)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from primal_attention.data.base import Batch, DataError
from primal_attention.data.cache import cache_dir
from primal_attention.data.lm import (
    EOT,
    SPLITS,
    BPETokenizer,
    LMData,
    lm_splits,
    lm_tokenizer,
    load_lm,
    shared_text_groups,
    split_works,
)

WORDS = "the and of to in that shall unto lord thou thy king love night death heaven earth sea fire".split()


def prose(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n_words // 7)]
    return "\n".join(line.capitalize() + "." for line in lines)


def corpus(n_works: int, seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"work{i:02d}": prose(seed * 1000 + i, rng.randint(50, 400)) for i in range(n_works)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path))
    return tmp_path


def test_split_by_work_is_a_deterministic_partition_near_five_percent() -> None:
    works = corpus(60)
    parts = split_works(works)
    assert parts == split_works(works)
    assert sorted(sum(parts.values(), [])) == sorted(works)  # every work once
    total = sum(map(len, works.values()))
    for split in ("val", "test"):
        share = sum(len(works[w]) for w in parts[split]) / total
        assert 0.03 < share < 0.07, (split, share)
    assert parts != split_works(works, seed=1)  # the permutation is what the seed moves


def test_editions_of_the_same_text_stay_in_one_split() -> None:
    works = corpus(30)
    works["edition_b"] = "A preface.\n" + works["work03"] + "\nAn index."
    groups = shared_text_groups(works)
    assert ["edition_b", "work03"] in groups and sum(map(len, groups)) == len(works)
    for seed in range(5):
        parts = split_works(works, seed=seed)
        assert len({s for s, names in parts.items() for w in names if w in ("work03", "edition_b")}) == 1


def test_a_corpus_of_large_works_stays_in_train() -> None:
    parts = split_works(corpus(3))
    assert parts["val"] == parts["test"] == [] and len(parts["train"]) == 3
    with pytest.raises(ValueError, match="held_out"):
        split_works(corpus(3), held_out={"test": 0.6, "val": 0.1})


def test_lm_splits_seed_each_corpus_and_cache_by_content(cache) -> None:
    corpora = {"a": corpus(40, seed=1), "b": corpus(40, seed=2)}
    splits = lm_splits(corpora)
    assert sorted(splits) == ["a", "b"] and set(splits["a"]) == set(SPLITS)
    assert len(list((cache / "lm").glob("splits-*.json"))) == 1
    assert lm_splits(corpora) == splits  # from the cache
    corpora["a"]["work00"] += " changed"
    lm_splits(corpora)
    assert len(list((cache / "lm").glob("splits-*.json"))) == 2


def test_bpe_round_trip_save_load_and_byte_counts(tmp_path) -> None:
    texts = list(corpus(10).values())
    tok = BPETokenizer.train(texts, 300)
    assert tok.vocab_size == 300 and tok.eot_id == 0
    assert BPETokenizer.train(texts, 300).to_json() == tok.to_json()  # deterministic
    odd = f"Naïve café — 日本語 😀\r\n\ttabs  and {EOT} as plain text"
    ids = tok.encode(odd)
    assert tok.decode(ids) == odd and tok.eot_id not in ids
    assert int(tok.token_bytes()[ids].sum()) == len(odd.encode())
    tok.save(tmp_path / "bpe.json")
    again = BPETokenizer.load(tmp_path / "bpe.json")
    assert again.encode(odd) == ids and again.decode([0]) == EOT
    with pytest.raises(ValueError, match="vocab_size must be >= 257"):
        BPETokenizer.train(texts, 200)
    with pytest.raises(DataError, match="cannot load"):
        BPETokenizer.load(tmp_path / "missing.json")


def test_blocks_cover_every_target_once_and_count_bytes() -> None:
    texts = list(corpus(6).values())
    tok = BPETokenizer.train(texts, 300)
    data = LMData.from_texts(texts, tok, 16, split="train")
    t = data.tokens
    assert t.dtype == torch.int64 and int((t == tok.eot_id).sum()) == len(texts) and t[-1] == tok.eot_id
    assert data.num_bytes == sum(len(x.encode()) for x in texts)
    blocks = data.blocks()
    m = (t.numel() - 1) // 16
    assert blocks.shape == (m, 17) == (len(data), 17)
    assert torch.equal(blocks[1:, 0], blocks[:-1, -1])  # consecutive windows share one boundary token
    assert torch.equal(blocks[:, 1:].reshape(-1), t[1:m * 16 + 1])  # each target exactly once
    assert data.target_bytes() == int(data.token_bytes[t[1:m * 16 + 1]].sum())
    assert data.blocks(40).shape == ((t.numel() - 1) // 40, 41)
    batch = data.batch(torch.tensor([2, 0]))
    assert isinstance(batch, Batch) and batch.x.shape == batch.y.shape == (2, 16)
    assert torch.equal(batch.x[1], blocks[0, :-1]) and torch.equal(batch.y[1], blocks[0, 1:])
    short = LMData.from_texts(texts, tok, 16, max_tokens=100)
    assert short.tokens.numel() == 100 and short.num_bytes == int(data.token_bytes[t[:100]].sum())
    with pytest.raises(DataError, match="cannot fill one block"):
        LMData.from_texts(texts, tok, 16, max_tokens=10)
    with pytest.raises(ValueError, match="block_len must be a positive int"):
        data.blocks(0)


def test_load_lm_end_to_end_from_a_cached_corpus(cache) -> None:
    corpora = {"verse": corpus(40, seed=3), "prose": corpus(30, seed=4)}
    (cache_dir("lm") / "corpora-v1.json").write_text(json.dumps({"version": 1, "corpora": corpora}))
    path = cache / "run" / "tokenizer.json"
    train = load_lm("train", vocab_size=300, block_len=32, tokenizer_path=path, progress=False)
    assert path.is_file() and train.vocab_size == 300 and train.blocks().shape[1] == 33
    splits = lm_splits(corpora)
    for split in SPLITS:
        data = load_lm(split, vocab_size=300, block_len=32, tokenizer_path=path, progress=False)
        assert data.works == {c: s[split] for c, s in splits.items()}
        assert data.num_bytes == sum(len(corpora[c][w].encode()) for c in corpora for w in splits[c][split])
        text = data.tokenizer.decode(data.tokens.tolist())
        assert text.count(EOT) == sum(len(w) for w in data.works.values())
    assert load_lm("val", vocab_size=300, block_len=8, max_tokens=50, progress=False).tokens.numel() == 50
    with pytest.raises(ValueError, match="has vocab_size 300, expected 512"):
        lm_tokenizer(512, path=path)
    with pytest.raises(ValueError, match="split must be one of"):
        load_lm("dev", vocab_size=300, block_len=8)


def test_the_real_corpora_split_as_documented() -> None:
    path = cache_dir("lm") / "corpora-v1.json"
    if not path.is_file():
        pytest.skip("the LM corpora are not in the cache (primal data fetch lm)")
    splits = lm_splits(progress=False)
    assert {c: len(sum(s.values(), [])) for c, s in splits.items()} == {"bible": 66, "milton": 7, "shakespeare": 42}
    assert splits["shakespeare"]["test"] == ["lovers_complaint", "loves_labours_lost", "midsummer_nights_dream",
                                             "passionate_pilgrim", "phoenix_and_the_turtle"]
    assert splits["shakespeare"]["val"] == ["macbeth", "sonnets", "two_gentlemen_of_verona"]
    assert splits["milton"]["test"] == ["paradise_regained"] and splits["milton"]["val"] == ["areopagitica"]
    assert splits["bible"]["val"] == ["2Pet", "3Jn", "Ge"]
    assert splits["bible"]["test"] == ["1Tim", "2Th", "Eph", "Ezra", "Hag", "Mat", "Nahum", "Phmn"]
    # the three editions of Milton's minor poems are together in train
    assert {"comus", "lallegro_il_penseroso_comus_and_lycidas", "poetical_works"} <= set(splits["milton"]["train"])
