"""Masked batched SVD, cumulative curves on the common grids, streaming statistics and plots."""

from __future__ import annotations

import json

import torch

from primal_attention.analysis import capture
from primal_attention.analysis import spectrum as sp
from primal_attention.analysis import spectrum_report
from primal_attention.data.base import SequenceData


def test_masked_svdvals_match_svdvals_of_the_restricted_matrices() -> None:
    torch.manual_seed(0)
    mats = torch.randn(4, 3, 9, 6)
    rows = torch.tensor([9, 4, 1, 7])
    cols = torch.tensor([6, 6, 2, 3])
    row_mask = torch.arange(9)[None] < rows[:, None]
    col_mask = torch.arange(6)[None] < cols[:, None]
    sv = sp.masked_svdvals(mats, row_mask[:, None], col_mask[:, None])
    assert sv.dtype == torch.float64 and sv.shape == (4, 3, 6)
    for b in range(4):
        r = min(int(rows[b]), int(cols[b]))
        expected = torch.linalg.svdvals(mats[b, :, : rows[b], : cols[b]].double())
        torch.testing.assert_close(sv[b, :, :r], expected, rtol=1e-10, atol=1e-12)
        assert bool((sv[b, :, r:].abs() < 1e-12).all())
    # Padding in the middle restricts the same way.
    keep = torch.tensor([True, False, True, True, False, True, False, True, True])
    sv = sp.masked_svdvals(mats[0, 0], keep, None)
    torch.testing.assert_close(sv[:6], torch.linalg.svdvals(mats[0, 0][keep].double()))
    # float32 input is promoted: a nearly rank-deficient matrix keeps its tiny singular value.
    u, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64))
    m = u @ torch.diag(torch.tensor([1.0, 0.5, 0.1, 1e-3, 1e-6], dtype=torch.float64)) @ u.T
    torch.testing.assert_close(sp.masked_svdvals(m)[-1], torch.tensor(1e-6, dtype=torch.float64), rtol=1e-6, atol=0)


def test_cumulative_curves_components_and_grids() -> None:
    sv = torch.tensor([[3.0, 2.0, 1.0, 0.0], [1.0, 1.0, 0.5, 7.0]], dtype=torch.float64)
    rank = torch.tensor([3, 2])
    cum = sp.cumulative_energy(sv, rank)
    torch.testing.assert_close(cum[0], torch.tensor([9 / 14, 13 / 14, 1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(cum[1], torch.tensor([0.5, 1.0, 1.0, 1.0], dtype=torch.float64))  # 7.0 is beyond r
    assert sp.components_for(cum, 0.9).tolist() == [2, 2]
    assert sp.components_for(cum, 0.6).tolist() == [1, 2]
    mass = sp.cumulative_energy(sv, rank, power=1.0)
    torch.testing.assert_close(mass[0], torch.tensor([0.5, 5 / 6, 1.0, 1.0], dtype=torch.float64))
    frac = sp.on_fraction_grid(cum, rank, torch.tensor([0.3, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(frac, torch.tensor([[9 / 14, 13 / 14, 1.0], [0.5, 0.5, 1.0]], dtype=torch.float64))
    zero = sp.cumulative_energy(torch.zeros(1, 3, dtype=torch.float64), torch.tensor([3]))
    assert zero.tolist() == [[1.0, 1.0, 1.0]]


def test_stats_summary_and_merge() -> None:
    sv = torch.tensor([[3.0, 2.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    rank = torch.tensor([3, 2, 4])
    whole = sp.SpectrumStats(6)
    whole.update(sv, rank)
    a, b = sp.SpectrumStats(6), sp.SpectrumStats(6)
    a.update(sv[:1], rank[:1])
    b.update(sv[1:], rank[1:])
    s, m = whole.summary(), a.merge(b).summary()
    assert s == m
    assert s["matrices"] == 3 and s["mean_rank"] == 3.0
    # k90 on σ²: 2 (9+4 ≥ 0.9·14), 2 (1+1), 1 (25 of 25); on σ: 3, 2, 1.
    assert s["components_90_mean"] == 5 / 3 and s["components_90_median"] == 2
    assert abs(s["components_90_std"] - (2 / 9) ** 0.5) < 1e-12
    assert s["components_sigma_90_mean"] == 2.0
    assert abs(s["components_90_fraction_mean"] - (2 / 3 + 1 + 1 / 4) / 3) < 1e-12
    assert len(s["cumulative_mean"]) == 6 and s["cumulative_mean"][-1] == 1.0
    assert abs(s["cumulative_mean"][0] - (9 / 14 + 1 / 2 + 1) / 3) < 1e-12
    assert abs(s["sigma_cumulative_mean"][0] - (1 / 2 + 1 / 2 + 1) / 3) < 1e-12  # Σσ: 3/6, 1/2, 5/5
    assert len(s["sigma_fraction_cumulative_std"]) == len(s["fraction_grid"])
    torch.testing.assert_close(torch.tensor(s["normalised_sv_mean"][:2], dtype=torch.float64),
                               torch.tensor([1.0, (2 / 3 + 1 + 0) / 3], dtype=torch.float64))


def test_padding_content_does_not_change_spectra(tiny_classifier, ragged_data) -> None:
    model = tiny_classifier()
    data = ragged_data()
    noisy = SequenceData(data.x + 5.0 * torch.randn_like(data.x) * (~data.mask)[..., None], data.mask, data.y, 3)
    a = sp.analyse_spectrum(model, data, batch_size=3)
    b = sp.analyse_spectrum(model, noisy, batch_size=3)
    for name, entry in a["layers"].items():
        for view, s in entry["views"].items():
            t = b["layers"][name]["views"][view]
            torch.testing.assert_close(torch.tensor(s["cumulative_mean"]), torch.tensor(t["cumulative_mean"]))
            torch.testing.assert_close(torch.tensor(s["normalised_sv_mean"]), torch.tensor(t["normalised_sv_mean"]))
            assert s["components_99_mean"] == t["components_99_mean"]


def test_streaming_statistics_equal_a_direct_per_matrix_computation(tiny_classifier, ragged_data) -> None:
    model = tiny_classifier()
    data = ragged_data()
    small = sp.analyse_spectrum(model, data, batch_size=2)
    whole = sp.analyse_spectrum(model, data, batch_size=7)
    s = small["layers"]["encoder.blocks.0.attn"]["views"]["attention"]
    w = whole["layers"]["encoder.blocks.0.attn"]["views"]["attention"]
    assert s["matrices"] == w["matrices"] == 7 * 2
    torch.testing.assert_close(torch.tensor(s["fraction_cumulative_mean"]), torch.tensor(w["fraction_cumulative_mean"]))
    assert s["components_90_mean"] == w["components_90_mean"]
    assert s["components_sigma_99_mean"] >= s["components_99_mean"]  # Σσ spreads more than Σσ²
    # Direct: each sample's real L×L attention per head, torch.linalg.svdvals, its own count.
    with capture.capture_inputs(model) as seen:
        model(data.x, data.mask)
    attn = capture.softmax_matrices(model.encoder.blocks[0].attn, seen["encoder.blocks.0.attn"].x, data.mask)["attention"]
    ks, curves = [], []
    for b in range(7):
        n = int(data.mask[b].sum())
        for h in range(2):
            e = torch.linalg.svdvals(attn[b, h, :n, :n]) ** 2
            c = e.cumsum(0) / e.sum()
            ks.append(int((c >= 0.9 - 1e-12).nonzero()[0]) + 1)
            curves.append(torch.cat([c, torch.ones(10 - n, dtype=torch.float64)]))
    assert abs(s["components_90_mean"] - sum(ks) / len(ks)) < 1e-12
    torch.testing.assert_close(torch.tensor(s["cumulative_mean"], dtype=torch.float64), torch.stack(curves).mean(0))
    assert small["examples"] == 7
    few = sp.analyse_spectrum(model, data, max_examples=3)
    assert few["layers"]["encoder.blocks.1.attn"]["views"]["kernel"]["matrices"] == 6
    assert few["layers"]["encoder.blocks.1.attn"]["views"]["scores"]["mean_rank"] == (6 + 3 + 6) / 3  # min(L, 2s)


def test_layer_groups_pool_same_kind_layers(tiny_classifier, ragged_data) -> None:
    model = tiny_classifier(("softmax", "primal", "primal"))
    data = ragged_data()
    result = sp.analyse_spectrum(model, data, group_size=2)
    assert list(result["groups"]) == ["encoder.blocks.0.attn", "primal layers 1-2"]
    pooled = result["groups"]["primal layers 1-2"]["views"]["kernel"]
    one = result["layers"]["encoder.blocks.1.attn"]["views"]["kernel"]
    two = result["layers"]["encoder.blocks.2.attn"]["views"]["kernel"]
    assert pooled["matrices"] == one["matrices"] + two["matrices"]
    expected = (torch.tensor(one["cumulative_mean"]) + torch.tensor(two["cumulative_mean"])) / 2
    torch.testing.assert_close(torch.tensor(pooled["cumulative_mean"]), expected)
    assert "groups" not in sp.analyse_spectrum(model, data)  # group size 1: the layers are the groups


def test_write_spectrum_writes_json_and_plots(tmp_path, tiny_classifier, ragged_data) -> None:
    result = sp.analyse_spectrum(tiny_classifier(), ragged_data(), batch_size=4)
    files = spectrum_report.write_spectrum(result, tmp_path / "out", title="tiny")
    names = {f.name for f in files}
    assert names == {"spectrum.json", "cumulative_index.png", "cumulative_fraction.png", "heatmap.png", "components.png"}
    for f in files:
        assert f.is_file()
        if f.suffix == ".png":
            assert f.read_bytes()[:4] == b"\x89PNG" and f.stat().st_size > 5000
    stored = json.loads((tmp_path / "out" / "spectrum.json").read_text())
    assert stored["layers"].keys() == result["layers"].keys()
    assert stored["layers"]["encoder.blocks.1.attn"]["views"]["scores"]["components_99_mean"] == \
        result["layers"]["encoder.blocks.1.attn"]["views"]["scores"]["components_99_mean"]
    assert "| encoder.blocks.1.attn | primal | scores |" in spectrum_report.components_table(result)
