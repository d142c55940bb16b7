"""UEA loader: the bundled JapaneseVowels and BasicMotions, hand-written .ts archives, failures,
and the stratified holdout split."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_attention.data import uea
from primal_attention.data.base import DataError
from primal_attention.data.splits import stratified_split
from primal_attention.data.uea import (
    UEA_PAPER_DATASETS,
    apply_normalization,
    fit_normalization,
    load_uea,
    load_uea_splits,
)

EPS = float(np.finfo(np.float64).eps)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Fail any test that tries to open a connection; the cache goes to a temporary folder."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield
    assert not attempts, f"a test tried the network: {attempts}"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def vowels():
    return load_uea_splits("JapaneseVowels")


@pytest.fixture(scope="module")
def vowels_raw():
    return load_uea_splits("JapaneseVowels", normalize="none")


def write_ts(path: Path, cases, *, labels=None, name="Tiny", equal_length=False) -> Path:
    """A .ts file in the UEA format: one case per line, channels split by ':', label last.

    ``cases``: list of ``(series (C, L), label)``.
    """
    channels = len(cases[0][0])
    labels = labels if labels is not None else sorted({label for _, label in cases})
    header = [
        "# written by the test",
        f"@problemName {name}",
        "@timeStamps false",
        "@missing false",
        f"@univariate {'true' if channels == 1 else 'false'}",
        f"@dimensions {channels}",
        f"@equalLength {'true' if equal_length else 'false'}",
        f"@classLabel true {' '.join(labels)}",
        "@data",
    ]
    rows = [
        ":".join(",".join(repr(float(v)) for v in channel) for channel in series) + f":{label}"
        for series, label in cases
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header + rows) + "\n")
    return path


def tiny_cases(rng, channels=2, lengths=(3, 5, 4), labels=("b", "a", "b")):
    return [(rng.normal(size=(channels, n)).round(4), lab) for n, lab in zip(lengths, labels)]


# ------------------------------------------------------------------------------------------------
# the bundled datasets


def test_paper_datasets_are_aeon_archive_names():
    from aeon.datasets.tsc_datasets import tsc_zenodo

    assert len(UEA_PAPER_DATASETS) == 10
    assert set(UEA_PAPER_DATASETS) <= set(tsc_zenodo)


def test_japanese_vowels_shapes(vowels):
    train, test = vowels
    info = UEA_PAPER_DATASETS["JapaneseVowels"]
    assert (len(train), len(test)) == (info.train, info.test) == (270, 370)
    assert train.x.shape == (270, 29, 12) and test.x.shape == (370, 29, 12)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert train.num_classes == test.num_classes == info.classes == 9
    assert train.vocab_size is None and train.name == "JapaneseVowels"
    assert train.meta["class_names"] == [str(i) for i in range(1, 10)]
    assert train.meta["found_in"] == "aeon-bundled"
    assert train.meta["source"].endswith("JapaneseVowels_TRAIN.ts")
    # the shared length is set by TEST: train series are 7-26 steps, test series 7-29
    assert train.meta["lengths"].min() == 7 and train.meta["lengths"].max() == 26
    assert test.meta["lengths"].min() == 7 and test.meta["lengths"].max() == 29
    assert torch.bincount(train.y).tolist() == [30] * 9
    assert torch.bincount(test.y).tolist() == [31, 35, 88, 44, 29, 24, 40, 50, 29]


def test_masks_match_original_lengths(vowels):
    for data in vowels:
        assert torch.equal(data.mask.sum(1), data.meta["lengths"])
        # real steps first, padding after
        assert torch.equal(data.mask, torch.arange(data.seq_len) < data.meta["lengths"][:, None])


def test_values_follow_the_file_time_major(vowels_raw):
    from aeon.datasets import load_from_ts_file

    train, _ = vowels_raw
    X, _ = load_from_ts_file(train.meta["source"])
    for i in (0, 100, 269):
        n = X[i].shape[1]
        assert torch.allclose(train.x[i, :n].double(), torch.from_numpy(X[i].T), atol=1e-6)
        assert (train.x[i, n:] == 0).all()


def test_standardised_with_train_statistics(vowels, vowels_raw):
    train, test = vowels
    steps = train.x[train.mask].double()
    assert torch.allclose(steps.mean(0), torch.zeros(12, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(steps.std(0), torch.ones(12, dtype=torch.float64), atol=1e-5)
    for data in vowels:
        assert (data.x[~data.mask] == 0).all()

    stats = train.meta["norm_stats"]
    assert stats["method"] == "standard" and test.meta["norm_stats"] == stats
    raw_train, raw_test = vowels_raw
    mean = raw_train.x[raw_train.mask].double().mean(0)
    std = raw_train.x[raw_train.mask].double().std(0)
    assert torch.allclose(torch.tensor(stats["mean"], dtype=torch.float64), mean, atol=1e-6)
    expected = ((raw_test.x.double() - mean) / (std + EPS)) * raw_test.mask[..., None]
    assert torch.allclose(test.x.double(), expected, atol=1e-5)
    # the test split has its own distribution: its mean is not zero under train statistics
    assert test.x[test.mask].double().mean(0).abs().max() > 0.05


def test_given_stats_are_applied_as_is(vowels):
    train, test = vowels
    again_train, again_test = load_uea_splits("JapaneseVowels", normalize=train.meta["norm_stats"])
    assert torch.equal(again_train.x, train.x) and torch.equal(again_test.x, test.x)
    # test statistics on the test split: the per-split convention of the Time-Series-Library copy
    test_stats = fit_normalization(load_uea("JapaneseVowels", "test", normalize="none"))
    own = load_uea("JapaneseVowels", "test", normalize=test_stats)
    assert own.x[own.mask].double().mean(0).abs().max() < 1e-5


def test_fit_and_apply_on_sequence_data_reproduce_the_loader(vowels, vowels_raw):
    raw_train, raw_test = vowels_raw
    assert raw_train.meta["norm_stats"] is None
    stats = fit_normalization(raw_train)
    loader_stats = vowels[0].meta["norm_stats"]
    assert stats["method"] == loader_stats["method"] == "standard"
    for key in ("mean", "std"):
        assert stats[key] == pytest.approx(loader_stats[key], abs=1e-6)
    assert torch.allclose(apply_normalization(raw_test, stats).x, vowels[1].x, atol=1e-6)
    assert apply_normalization(raw_test, stats).meta["norm_stats"] == stats


def test_minmax_maps_train_into_unit_interval():
    train, test = load_uea_splits("JapaneseVowels", normalize="minmax")
    steps = train.x[train.mask]
    assert torch.allclose(steps.amin(0), torch.zeros(12), atol=1e-6)
    assert torch.allclose(steps.amax(0), torch.ones(12), atol=1e-6)
    assert (test.x[~test.mask] == 0).all()


def test_mismatched_stats_are_refused(vowels):
    motions = load_uea("BasicMotions", "train")
    with pytest.raises(DataError, match=r"for 6 channels, got \(12,\)"):
        apply_normalization(motions, vowels[0].meta["norm_stats"])
    with pytest.raises(DataError, match="method"):
        load_uea("BasicMotions", "train", normalize={"method": "robust"})
    with pytest.raises(ValueError, match="normalize"):
        load_uea("BasicMotions", "train", normalize="zscore")


def test_load_uea_is_one_split_of_load_uea_splits(vowels):
    test = load_uea("JapaneseVowels", "TEST")
    assert torch.equal(test.x, vowels[1].x) and torch.equal(test.y, vowels[1].y)
    with pytest.raises(ValueError, match="split"):
        load_uea("JapaneseVowels", "val")


def test_basic_motions_loads():
    train, test = load_uea_splits("BasicMotions")
    assert train.x.shape == (40, 100, 6) and test.x.shape == (40, 100, 6)
    assert train.mask.all() and test.mask.all()
    assert train.meta["class_names"] == ["badminton", "running", "standing", "walking"]
    assert torch.bincount(train.y).tolist() == [10] * 4


def test_regression_problem_is_refused():
    with pytest.raises(DataError, match="Covid3Month_TRAIN.ts: not a classification problem"):
        load_uea_splits("Covid3Month")


# ------------------------------------------------------------------------------------------------
# .ts files from a folder


def test_archive_layout_written_by_hand(tmp_path):
    (tmp_path / "Tiny").mkdir()
    (tmp_path / "Tiny" / "Tiny_TRAIN.ts").write_text(
        "#A two-channel toy problem\n"
        "@problemName Tiny\n@timeStamps false\n@missing false\n@univariate false\n"
        "@dimensions 2\n@equalLength false\n@classLabel true 2 10\n@data\n"
        "1.0,2.0,3.0:10.0,20.0,30.0:10\n"
        "4.0,5.0:40.0,50.0:2\n"
    )
    (tmp_path / "Tiny" / "Tiny_TEST.ts").write_text(
        "@problemName Tiny\n@timeStamps false\n@missing false\n@univariate false\n"
        "@dimensions 2\n@equalLength false\n@classLabel true 2 10\n@data\n"
        "6.0,7.0,8.0,9.0:60.0,70.0,80.0,90.0:2\n"
    )
    train, test = load_uea_splits("Tiny", data_dir=tmp_path, normalize="none")
    assert train.meta["found_in"] == "data_dir"
    assert train.x.shape == (2, 4, 2) and test.x.shape == (1, 4, 2)
    assert train.x[0].tolist() == [[1, 10], [2, 20], [3, 30], [0, 0]]
    assert train.mask.tolist() == [[True, True, True, False], [True, True, False, False]]
    assert train.meta["class_names"] == ["2", "10"]  # numeric names sort by value
    assert train.y.tolist() == [1, 0] and test.y.tolist() == [0]


def test_flat_layout_and_normalisation(tmp_path):
    rng = np.random.default_rng(0)
    train_cases = tiny_cases(rng, channels=3, lengths=(4, 7, 2, 5), labels=("Walk", "Run", "Run", "Sit"))
    test_cases = tiny_cases(rng, channels=3, lengths=(9, 3), labels=("Sit", "Walk"))
    write_ts(tmp_path / "Tiny_TRAIN.ts", train_cases)
    write_ts(tmp_path / "Tiny_TEST.ts", test_cases)
    train, test = load_uea_splits("Tiny", data_dir=str(tmp_path))
    assert train.seq_len == test.seq_len == 9
    assert train.meta["class_names"] == ["run", "sit", "walk"]  # aeon lower-cases labels
    assert train.y.tolist() == [2, 0, 0, 1] and test.y.tolist() == [1, 2]
    raw = np.concatenate([s.T for s, _ in train_cases])
    mean, std = raw.mean(0), raw.std(0, ddof=1)
    expected = (test_cases[0][0].T - mean) / (std + EPS)
    assert np.allclose(test.x[0].numpy(), expected, atol=1e-5)
    assert (test.x[1, 3:] == 0).all() and (train.x[2, 2:] == 0).all()


def test_max_len_pads_and_cuts(tmp_path):
    rng = np.random.default_rng(1)
    write_ts(tmp_path / "Tiny_TRAIN.ts", tiny_cases(rng, lengths=(3, 6), labels=("a", "b")))
    write_ts(tmp_path / "Tiny_TEST.ts", tiny_cases(rng, lengths=(2,), labels=("a",)))
    long_train, _ = load_uea_splits("Tiny", data_dir=tmp_path, normalize="none", max_len=10)
    assert long_train.seq_len == 10 and long_train.mask.sum(1).tolist() == [3, 6]
    short_train, _ = load_uea_splits("Tiny", data_dir=tmp_path, normalize="none", max_len=4)
    assert short_train.mask.sum(1).tolist() == [3, 4]
    assert short_train.meta["lengths"].tolist() == [3, 6]
    assert torch.equal(short_train.x, long_train.x[:, :4])


def test_missing_values_are_interpolated(tmp_path):
    rows = "@data\n1.0,NaN,3.0,?:5.0,6.0,NaN,8.0:a\n"
    header = (
        "@problemName Gap\n@timeStamps false\n@missing true\n@univariate false\n@dimensions 2\n"
        "@equalLength true\n@seriesLength 4\n@classLabel true a\n"
    )
    (tmp_path / "Gap_TRAIN.ts").write_text(header + rows)
    (tmp_path / "Gap_TEST.ts").write_text(header + rows)
    train, _ = load_uea_splits("Gap", data_dir=tmp_path, normalize="none")
    assert train.x[0].tolist() == [[1, 5], [2, 6], [3, 7], [3, 8]]


def test_channel_without_observations_is_refused(tmp_path):
    header = (
        "@problemName Gap\n@missing true\n@univariate false\n@equalLength false\n"
        "@classLabel true a\n"
    )
    (tmp_path / "Gap_TRAIN.ts").write_text(header + "@data\n1.0,2.0:NaN,NaN:a\n")
    (tmp_path / "Gap_TEST.ts").write_text(header + "@data\n1.0,2.0:3.0,4.0:a\n")
    with pytest.raises(DataError, match=r"Gap_TRAIN.ts: case 1, channel 1 has no observed values"):
        load_uea_splits("Gap", data_dir=tmp_path)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("@data\n1.0,2.0:3.0,4.0:a\n1.0,oops:3.0,4.0:b\n", id="not-a-number"),
        pytest.param("@data\n1.0,2.0:3.0,4.0:a\n1.0,2.0:b\n", id="channel-count-changes"),
        pytest.param("@data\n1.0,2.0:3.0,4.0,5.0:a\n", id="channels-of-unequal-length"),
        pytest.param("1.0,2.0:3.0,4.0:a\n", id="no-data-tag"),
    ],
)
def test_corrupt_file_is_named(tmp_path, body):
    header = "@problemName Bad\n@univariate false\n@equalLength false\n@classLabel true a b\n"
    write_ts(tmp_path / "Bad" / "Bad_TRAIN.ts", tiny_cases(np.random.default_rng(2), labels="aba"))
    (tmp_path / "Bad" / "Bad_TEST.ts").write_text(header + body)
    with pytest.raises(DataError, match=r"Bad_TEST\.ts"):
        load_uea_splits("Bad", data_dir=tmp_path)


def test_channel_mismatch_between_train_and_test(tmp_path):
    rng = np.random.default_rng(3)
    write_ts(tmp_path / "Tiny_TRAIN.ts", tiny_cases(rng, channels=2))
    write_ts(tmp_path / "Tiny_TEST.ts", tiny_cases(rng, channels=3))
    with pytest.raises(DataError, match=r"Tiny_TRAIN\.ts has 2 channels but .*Tiny_TEST\.ts has 3"):
        load_uea_splits("Tiny", data_dir=tmp_path)


def test_test_label_unseen_in_train(tmp_path):
    rng = np.random.default_rng(4)
    write_ts(tmp_path / "Tiny_TRAIN.ts", tiny_cases(rng, labels=("a", "b", "a")))
    write_ts(tmp_path / "Tiny_TEST.ts", tiny_cases(rng, labels=("a", "c", "b")))
    with pytest.raises(DataError, match=r"labels \['c'\]"):
        load_uea_splits("Tiny", data_dir=tmp_path)


def test_half_a_pair_is_reported(tmp_path):
    write_ts(tmp_path / "Tiny" / "Tiny_TRAIN.ts", tiny_cases(np.random.default_rng(5)))
    with pytest.raises(DataError, match=r"found .*Tiny_TRAIN\.ts but not .*Tiny_TEST\.ts"):
        load_uea_splits("Tiny", data_dir=tmp_path)


def test_reader_without_aeon(tmp_path, monkeypatch):
    write_ts(tmp_path / "Tiny_TRAIN.ts", tiny_cases(np.random.default_rng(6)))
    write_ts(tmp_path / "Tiny_TEST.ts", tiny_cases(np.random.default_rng(7)))
    monkeypatch.setitem(sys.modules, "aeon.datasets", None)
    with pytest.raises(DataError, match="pip install aeon"):
        load_uea_splits("Tiny", data_dir=tmp_path)


# ------------------------------------------------------------------------------------------------
# absent data and the downloader (simulated: the network is never tried)


def test_absent_dataset_names_the_options():
    with pytest.raises(DataError) as err:
        load_uea("EthanolConcentration", "train")
    message = str(err.value)
    assert "'EthanolConcentration' not found" in message
    assert "data_dir=" in message and "download=True" in message
    assert "JapaneseVowels" in message  # lists what is bundled


def test_data_dir_is_searched_alone(tmp_path):
    with pytest.raises(DataError, match=r"JapaneseVowels.*not found \(searched " + str(tmp_path)):
        load_uea("JapaneseVowels", "train", data_dir=tmp_path)


def test_unknown_name_is_not_downloaded(monkeypatch):
    import aeon.datasets

    monkeypatch.setattr(aeon.datasets, "load_classification", pytest.fail)
    with pytest.raises(DataError, match="no classification dataset of that name.*JapaneseVowels"):
        load_uea("JapaneseVowel", "train", download=True)


def test_download_without_network_explains(monkeypatch):
    import aeon.datasets

    def offline(name, extract_path=None, **kwargs):
        raise ValueError(f"Could not download files for {name} from Zenodo record 1: URLError")

    monkeypatch.setattr(aeon.datasets, "load_classification", offline)
    with pytest.raises(DataError, match="download with aeon .* failed .*URLError.*data_dir="):
        load_uea("Heartbeat", "train", download=True)


def test_a_failed_download_leaves_no_folder(monkeypatch, tmp_path):
    import aeon.datasets

    def half(name, extract_path=None, **kwargs):
        (Path(extract_path) / name).mkdir(parents=True)
        (Path(extract_path) / name / "partial.zip").write_bytes(b"x")
        raise OSError("connection reset")

    monkeypatch.setattr(aeon.datasets, "load_classification", half)
    with pytest.raises(DataError, match="connection reset"):
        load_uea("Heartbeat", "train", data_dir=tmp_path, download=True)
    assert list(tmp_path.iterdir()) == []


def test_download_lands_in_the_cache_and_is_reused(monkeypatch, tmp_path):
    import aeon.datasets

    calls = []

    def fake_download(name, extract_path=None, **kwargs):
        calls.append((name, extract_path, kwargs))
        rng = np.random.default_rng(8)
        write_ts(Path(extract_path) / name / f"{name}_TRAIN.ts", tiny_cases(rng), name=name)
        write_ts(Path(extract_path) / name / f"{name}_TEST.ts", tiny_cases(rng), name=name)

    monkeypatch.setattr(aeon.datasets, "load_classification", fake_download)
    first = load_uea("Heartbeat", "train", download=True)
    assert first.meta["found_in"] == "download" and len(calls) == 1
    name, extract_path, kwargs = calls[0]
    assert Path(extract_path) == tmp_path / "cache" / "uea"
    assert kwargs == {"load_equal_length": False, "load_no_missing": False}  # original lengths
    again = load_uea("Heartbeat", "train")
    assert again.meta["found_in"] == "cache" and len(calls) == 1
    assert torch.equal(again.x, first.x)


def test_download_into_data_dir(monkeypatch, tmp_path):
    import aeon.datasets

    def fake_download(name, extract_path=None, **kwargs):
        rng = np.random.default_rng(9)
        write_ts(Path(extract_path) / name / f"{name}_TRAIN.ts", tiny_cases(rng), name=name)
        write_ts(Path(extract_path) / name / f"{name}_TEST.ts", tiny_cases(rng), name=name)

    monkeypatch.setattr(aeon.datasets, "load_classification", fake_download)
    data = load_uea("Handwriting", "test", data_dir=tmp_path / "uea", download=True)
    assert data.meta["source"] == str(tmp_path / "uea" / "Handwriting" / "Handwriting_TEST.ts")


def test_bundled_list():
    assert {"JapaneseVowels", "BasicMotions"} <= set(uea.bundled_uea_datasets())


# ------------------------------------------------------------------------------------------------
# stratified holdout split


def test_stratified_split_on_japanese_vowels(vowels):
    train = vowels[0]
    keep, held = stratified_split(train.y, 0.2, seed=0)
    assert torch.bincount(train.y[held]).tolist() == [6] * 9
    assert torch.bincount(train.y[keep]).tolist() == [24] * 9
    assert len(train.subset(held)) == 54


def test_stratified_split_is_deterministic_and_seeded():
    y = torch.arange(200) % 7
    a = stratified_split(y, 0.3, seed=5)
    b = stratified_split(y, 0.3, seed=5)
    c = stratified_split(y, 0.3, seed=6)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[1], c[1])
    assert a[0].dtype == torch.int64 and torch.equal(a[1], a[1].sort().values)


def test_stratified_split_small_classes():
    y = np.array([0] * 10 + [1] * 3 + [2] * 1 + [3] * 2)
    keep, held = stratified_split(y, 0.1, seed=0)
    held_counts = np.bincount(y[held.numpy()], minlength=4).tolist()
    assert held_counts == [1, 1, 0, 1]  # round(0.3) and round(0.2) raised to one; the singleton stays
    assert set(y[keep.numpy()]) == {0, 1, 2, 3}
    assert stratified_split(y, 0.0)[1].numel() == 0
    with pytest.raises(ValueError, match="fraction"):
        stratified_split(y, 1.0)
    with pytest.raises(ValueError, match="integer"):
        stratified_split(np.array([0.5, 1.5]), 0.5)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    fraction=st.floats(0.01, 0.95),
    seed=st.integers(0, 2**31),
)
def test_stratified_split_properties(counts, fraction, seed):
    y = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng(seed).shuffle(y)
    keep, held = stratified_split(y, fraction, seed)
    both = torch.cat([keep, held]).sort().values
    assert torch.equal(both, torch.arange(len(y)))
    for cls, n in enumerate(counts):
        n_held = int(np.sum(y[held.numpy()] == cls))
        if n == 1:
            assert n_held == 0
        else:
            assert 1 <= n_held <= n - 1
            # rounding moves at most half an example, the clamp to [1, n - 1] a little more
            target = min(max(fraction * n, 1), n - 1)
            assert abs(n_held - target) <= 0.5 + 1e-9


def test_infinite_values_are_an_error_at_load(tmp_path):
    rng = np.random.default_rng(2)
    cases = tiny_cases(rng, lengths=(3, 4), labels=("a", "b"))
    cases[1][0][1, 2] = np.inf
    write_ts(tmp_path / "Tiny_TRAIN.ts", cases)
    write_ts(tmp_path / "Tiny_TEST.ts", tiny_cases(rng, lengths=(2,), labels=("a",)))
    with pytest.raises(DataError, match=r"case 2, channel 1, step 2 is infinite"):
        load_uea_splits("Tiny", data_dir=tmp_path)


def test_a_label_outside_class_label_is_an_error(tmp_path):
    rng = np.random.default_rng(3)
    write_ts(tmp_path / "Tiny_TRAIN.ts", tiny_cases(rng, lengths=(3, 4, 2), labels=("a", "b", "c")), labels=["a", "b"])
    write_ts(tmp_path / "Tiny_TEST.ts", tiny_cases(rng, lengths=(2,), labels=("a",)))
    with pytest.raises(DataError, match=r"labels \['c'\] are not declared in @classLabel"):
        load_uea_splits("Tiny", data_dir=tmp_path)
