"""Trivial baselines on a config's own splits: what a number means before any attention is involved.

``trivial_baselines(cfg)`` builds the data of ``cfg`` under the holdout protocol (the same validation
split, drawn with ``train.seed``, that the models are selected on) and scores, per family:

* classification (UEA, LRA, vision): the **majority class** of TRAIN; a **linear** classifier on the raw
  input (pixels; the flattened, length-padded series; hashed bags of token 1- and 2-grams for token
  tasks), its weight decay selected on validation; a **position-blind** MLP on features
  that ignore order — token frequencies (the bag of tokens; for LRA Image, the grey-level histogram),
  per-channel statistics of a time series (mean, std, min, max over the real steps), or per-channel
  pixel histograms of an image — with its epoch selected on validation; for ListOps also the
  **outermost operator**: a lookup from the first token to the TRAIN majority label of that token.
* language models: **unigram** and **bigram** models of TRAIN with add-k smoothing (k selected on
  validation): perplexity and bits per byte on the same targets the models are scored on.
* offline RL: the **behaviour policy**, the D4RL-normalised mean return of the dataset's own episodes; and a
  **linear** policy (ridge regression of actions on states, the ridge selected on validation rollouts).

Every entry: ``{"val_<metric>": ..., "test_<metric>": ..., "what": a one-line description}``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.train.config import ExperimentConfig
from primal_attention.train.data import build_splits
from primal_attention.train.families import get_family

__all__ = ["trivial_baselines", "majority_class", "first_token_lookup", "ngram_lm", "position_blind_features",
           "fit_mlp", "lm_baselines", "raw_features", "fit_linear", "select_widened", "grid_text", "at_edge", "DECAYS", "RIDGES"]


def majority_class(train_y: Tensor, *ys: Tensor) -> list[float]:
    """Accuracy on each of ``ys`` of always predicting TRAIN's most frequent class (ties: lowest label)."""
    label = int(torch.bincount(train_y).argmax())
    return [float((y == label).float().mean()) for y in ys]


def first_token_lookup(train_x: Tensor, train_y: Tensor, *sets: tuple[Tensor, Tensor]) -> list[float]:
    """Accuracy on each (x, y) of predicting TRAIN's majority label of the example's first token
    (TRAIN's majority class for a first token TRAIN never saw)."""
    fallback = int(torch.bincount(train_y).argmax())
    table: dict[int, int] = {}
    first = train_x[:, 0]
    for token in first.unique().tolist():
        table[token] = int(torch.bincount(train_y[first == token]).argmax())
    out = []
    for x, y in sets:
        pred = torch.tensor([table.get(t, fallback) for t in x[:, 0].tolist()], dtype=y.dtype)
        out.append(float((pred == y).float().mean()))
    return out


def _bag(x: Tensor, mask: Tensor, vocab: int) -> Tensor:
    """Token frequencies over the real tokens (M, V) and log(1 + length) (M, 1)."""
    m, length = mask.shape[0], mask.sum(1)
    counts = torch.zeros(m, vocab)
    counts.scatter_add_(1, x.long(), mask.float())
    return torch.cat([counts / length.clamp_min(1)[:, None], torch.log1p(length.float())[:, None]], dim=1)


def _channel_stats(x: Tensor, mask: Tensor) -> Tensor:
    """Mean, std, min, max of every channel over the real steps (M, 4C), and log(1 + length) (M, 1)."""
    w = mask[..., None].float()
    n = w.sum(1).clamp_min(1)
    mean = (x * w).sum(1) / n
    std = (((x - mean[:, None]) ** 2 * w).sum(1) / n).sqrt()
    big = torch.finfo(x.dtype).max
    lo = torch.where(mask[..., None], x, big).amin(1)
    hi = torch.where(mask[..., None], x, -big).amax(1)
    return torch.cat([mean, std, lo, hi, torch.log1p(n[:, :1])], dim=1)


def _pixel_histograms(x: Tensor, bins: int, lo: Tensor, hi: Tensor) -> Tensor:
    """Per-channel histograms of the pixel values (M, C·bins) on TRAIN's value range per channel."""
    m, c = x.shape[:2]
    flat = x.reshape(m, c, -1)
    idx = ((flat - lo[None, :, None]) / (hi - lo).clamp_min(1e-12)[None, :, None] * bins).long().clamp(0, bins - 1)
    hist = torch.zeros(m, c, bins)
    hist.scatter_add_(2, idx, torch.ones_like(flat))
    return (hist / flat.shape[-1]).reshape(m, c * bins)


def position_blind_features(splits: list[Any], *, bins: int = 32) -> tuple[list[Tensor], str]:
    """Order-free features of each split (same featurisation for all, fitted on the first = TRAIN)
    and a description of them."""
    train = splits[0]
    if train.x.dim() == 4:  # images (M, C, H, W)
        lo, hi = train.x.transpose(0, 1).reshape(train.x.shape[1], -1).aminmax(dim=1)
        return [_pixel_histograms(d.x, bins, lo, hi) for d in splits], f"per-channel pixel histograms ({bins} bins)"
    if train.vocab_size is not None:
        one = lambda x, m: _bag(x, m, train.vocab_size)  # noqa: E731
        what = "token frequencies (bag of tokens)" + (", grey-level histogram" if train.name.startswith("image") else "")
        if train.x2 is not None:  # two documents: u, v, u * v, |u - v|
            feats = []
            for d in splits:
                u, v = one(d.x, d.mask), one(d.x2, d.mask2)
                feats.append(torch.cat([u, v, u * v, (u - v).abs()], dim=1))
            return feats, what + " of both documents, [u, v, u·v, |u−v|]"
        return [one(d.x, d.mask) for d in splits], what
    return [_channel_stats(d.x, d.mask) for d in splits], "per-channel mean, std, min, max over the real steps"


#: hashed n-gram buckets of the linear baseline on token tasks.
NGRAM_BUCKETS = 4096


def _ngram_bag(x: Tensor, mask: Tensor, vocab: int, buckets: int) -> Tensor:
    """Frequencies of token unigrams and bigrams over the real tokens, bigrams hashed into ``buckets`` (M, V + buckets)."""
    m = x.shape[0]
    uni = _bag(x, mask, vocab)[:, :vocab]
    pair_real = (mask[:, 1:] & mask[:, :-1]).float()
    code = (x[:, :-1].long() * 1_000_003 + x[:, 1:].long()) % buckets
    bi = torch.zeros(m, buckets)
    bi.scatter_add_(1, code, pair_real)
    return torch.cat([uni, bi / pair_real.sum(1, keepdim=True).clamp_min(1)], dim=1)


def raw_features(splits: list[Any]) -> tuple[list[Tensor], str]:
    """The raw input of each split as a vector, for a linear model, and a description: pixels of images;
    the grey levels of LRA Image and the pixels of Pathfinder (tokens = value + 1); hashed bags of token
    1- and 2-grams for the other token tasks (both documents' concatenated for two-document tasks); the
    flattened series for time series, zero past each series' end."""
    train = splits[0]
    if train.x.dim() == 4:
        return [d.x.reshape(d.x.shape[0], -1).float() for d in splits], "raw pixels"
    if train.vocab_size is not None:
        if train.name.lower().startswith(("image", "cifar", "pathfinder", "fashion")):
            return [(d.x.float() - 1.0) * d.mask.float() for d in splits], "raw pixel values (token − 1)"
        one = lambda x, m: _ngram_bag(x, m, train.vocab_size, NGRAM_BUCKETS)  # noqa: E731
        what = f"token 1-gram and hashed 2-gram ({NGRAM_BUCKETS} buckets) frequencies"
        if train.x2 is not None:
            return [torch.cat([one(d.x, d.mask), one(d.x2, d.mask2)], dim=1) for d in splits], what + " of both documents"
        return [one(d.x, d.mask) for d in splits], what
    return [(d.x * d.mask[..., None]).reshape(d.x.shape[0], -1).float() for d in splits], \
        "the flattened series, zero-padded past its end"


def at_edge(tried: Sequence[float], chosen: float) -> bool:
    """Whether ``chosen`` is the smallest or largest of the sorted values ``tried`` (never for a single value)."""
    return len(tried) > 1 and chosen in (tried[0], tried[-1])


def select_widened(grid: tuple[float, ...], score: Callable[[float], tuple[float, Any]], *, factor: float = 10.0,
                   max_widen: int = 6) -> tuple[float, float, Any, list[float]]:
    """The value of ``grid`` whose ``score(value) -> (validation score, payload)`` is highest (ties: the larger
    value), the grid widened by ``factor`` beyond an edge (at most ``max_widen`` times a side) while the choice
    lies there, so no baseline's regularisation is chosen at the edge of what was tried. Returns (value, its
    validation score, its payload, the sorted values tried); the caller states the values tried (:func:`grid_text`).
    """
    scored: dict[float, tuple[float, Any]] = {}
    widened = 0
    while True:
        for value in sorted(set(grid) - set(scored), reverse=True):
            scored[value] = score(value)
        tried = sorted(scored)
        best = max(tried, key=lambda v: (scored[v][0], v))
        if widened >= max_widen or not at_edge(tried, best):
            return best, scored[best][0], scored[best][1], tried
        grid = (float(f"{best * factor if best == tried[-1] else best / factor:.6g}"),)  # 1e-6, not 1.0000000000000002e-06
        widened += 1


#: the linear classifier's starting grid of L2 weight decays (widened past an edge by :func:`select_widened`)
DECAYS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
#: the linear policy's starting grid of ridges
RIDGES = (1e-2, 1.0, 1e2, 1e4)


def grid_text(tried: Sequence[float], chosen: float | None = None) -> str:
    """``"{1e-06, …, 0.1}"``; with ``chosen``, ``"…, here 0.01"`` and ``", at the edge of what was tried"``
    where it remained there."""
    text = "{" + ", ".join(f"{v:g}" for v in tried) + "}"
    if chosen is None:
        return text
    edge = ", at the edge of what was tried" if at_edge(tried, chosen) else ""
    return f"{text}, here {chosen:g}{edge}"


def fit_linear(train: tuple[Tensor, Tensor], val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], num_classes: int,
               *, decays: tuple[float, ...] = DECAYS, steps: int = 300, seed: int = 0
               ) -> tuple[float, float, float, list[float]]:
    """Multinomial logistic regression on standardised features, full batch (L-BFGS), one fit per L2
    weight decay; returns (val, test accuracy, decay, the decays tried) of the decay with the best validation
    accuracy (ties: the larger decay), ``decays`` widened tenfold past an edge while the choice lies there
    (:func:`select_widened`). Test is scored once, for that decay."""
    (xt, yt), (xv, yv), (xs, ys) = train, val, test
    mean, std = xt.mean(0), xt.std(0).clamp_min(1e-6)
    xt, xv, xs = ((a - mean) / std for a in (xt, xv, xs))

    def fit(decay: float) -> tuple[float, nn.Module]:
        torch.manual_seed(seed)
        model = nn.Linear(xt.shape[1], num_classes)
        opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=steps, history_size=20,
                                line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xt), yt) + decay * model.weight.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            return float((model(xv).argmax(-1) == yv).float().mean()), model

    decay, acc_v, model, tried = select_widened(decays, fit)
    with torch.no_grad():
        acc_t = float((model(xs).argmax(-1) == ys).float().mean())
    return acc_v, acc_t, decay, tried


def fit_mlp(train: tuple[Tensor, Tensor], val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], num_classes: int, *,
            hidden: int = 256, epochs: int = 60, lr: float = 1e-3, batch_size: int = 256, seed: int = 0) -> tuple[float, float]:
    """A one-hidden-layer MLP on standardised features; returns (val, test) accuracy at the epoch with
    the best validation accuracy (the first such epoch)."""
    g = torch.Generator().manual_seed(seed)
    (xt, yt), (xv, yv), (xs, ys) = train, val, test
    mean, std = xt.mean(0), xt.std(0).clamp_min(1e-6)
    xt, xv, xs = ((a - mean) / std for a in (xt, xv, xs))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(xt.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-4)
    best = (-1.0, 0.0)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt), generator=g).split(batch_size):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc_v = float((model(xv).argmax(-1) == yv).float().mean())
            if acc_v > best[0]:
                best = (acc_v, float((model(xs).argmax(-1) == ys).float().mean()))
    return best


def ngram_lm(train: Tensor, order: int, vocab: int, *evals: Tensor, k: float) -> list[float]:
    """Mean NLL (nats) per predicted token of an add-k smoothed unigram (order 1) or bigram (order 2)
    model of the TRAIN stream, on each stream of ``evals`` (predicting tokens[1:] from their past)."""
    if order == 1:
        logp = torch.log((torch.bincount(train, minlength=vocab).double() + k) / (train.numel() + k * vocab))
        return [float(-logp[s[1:]].mean()) for s in evals]
    pairs = torch.bincount(train[:-1] * vocab + train[1:], minlength=vocab * vocab).double()
    context = torch.bincount(train[:-1], minlength=vocab).double()
    out = []
    for s in evals:
        prev, nxt = s[:-1], s[1:]
        p = (pairs[prev * vocab + nxt] + k) / (context[prev] + k * vocab)
        out.append(float(-torch.log(p).mean()))
    return out


def lm_baselines(splits) -> dict[str, dict[str, Any]]:
    """Unigram and bigram models of TRAIN, add-k smoothed with k selected on validation."""
    train, val, test = splits.train, splits.val, splits.test
    vocab = train.vocab_size
    streams = [_predicted_stream(d) for d in (val, test)]
    out = {}
    for order, name in ((1, "unigram"), (2, "bigram")):
        ks = (1e-3, 1e-2, 1e-1, 1.0)
        val_nll = [ngram_lm(train.tokens, order, vocab, streams[0], k=k)[0] for k in ks]
        k = ks[min(range(len(ks)), key=val_nll.__getitem__)]
        nll_v, nll_t = ngram_lm(train.tokens, order, vocab, *streams, k=k)
        row: dict[str, Any] = {"what": f"{name} model of TRAIN, add-k smoothing, k = {k:g} selected on validation"}
        for split, data, nll, stream in (("val", val, nll_v, streams[0]), ("test", test, nll_t, streams[1])):
            nbytes = int(data.token_bytes[stream[1:]].sum())
            row.update({f"{split}_loss": nll, f"{split}_ppl": math.exp(nll),
                        f"{split}_bpb": nll * (stream.numel() - 1) / (math.log(2) * max(nbytes, 1))})
        out[name] = row
    return out


def ridge_fit(x: Tensor, y: Tensor, ridge: float) -> np.ndarray:
    """Weights (F + 1, O) of ``y (N, O) ≈ [x, 1] @ w`` for ``x (N, F)``, L2 penalty ``ridge`` on all but the
    bias row (the last), closed form in float64."""
    xb = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    penalty = torch.eye(xb.shape[1], dtype=torch.float64)
    penalty[-1, -1] = 0.0
    return torch.linalg.solve(xb.T @ xb + ridge * penalty, xb.T @ y.double()).numpy()


def _affine_policy(w: np.ndarray):
    """The memoryless policy ``states (E, F) -> [states, 1] @ w`` of ridge weights ``w (F + 1, A)``."""
    return lambda s: s @ w[:-1] + w[-1]


def linear_policy(train, val, test, *, ridges: tuple[float, ...] = RIDGES) -> dict[str, Any]:
    """Linear behaviour cloning: ridge regression of the dataset's actions on its normalised states (with a
    bias; no return conditioning), one closed-form fit per ridge; the ridge whose VALIDATION rollouts
    score best (ties: the larger ridge; ``ridges`` widened a hundredfold past an edge while the choice lies
    there) is rolled out once on TEST. ``train`` is the :class:`RLData`, ``val`` and ``test`` its
    :class:`RolloutSet` s (the models' own env seeds and horizon)."""
    from primal_attention.train.rollout import policy_rollout

    def fit(ridge: float) -> tuple[float, np.ndarray]:
        w = ridge_fit(train.states, train.actions, ridge)
        return policy_rollout(_affine_policy(w), val)["score"], w

    ridge, score_v, w, tried = select_widened(ridges, fit, factor=100.0)
    test_score = policy_rollout(_affine_policy(w), test)["score"]
    return {"what": f"linear behaviour cloning (ridge regression of actions on states; ridge chosen on "
                    f"{val.episodes} validation rollouts from {grid_text(RIDGES)}, widened a hundredfold past an edge "
                    "while the choice lies there)",
            "val_score": score_v, "test_score": test_score, "choice": ridge, "tried": tried}


def _predicted_stream(data) -> Tensor:
    """The tokens the models' evaluation reads and predicts: the blocks' span ``tokens[: M·L + 1]``."""
    blocks = data.blocks()
    return data.tokens[: blocks.shape[0] * data.block_len + 1]


def trivial_baselines(cfg: ExperimentConfig, *, seed: int | None = None) -> dict[str, dict[str, Any]]:
    """The trivial baselines of ``cfg``'s data, on the splits its holdout runs use (see module doc)."""
    t = dataclasses.replace(cfg.train, protocol="holdout", seed=cfg.train.seed if seed is None else seed)
    holdout = dataclasses.replace(cfg, train=t)
    return get_family(cfg.data.family).trivial_baselines(holdout, build_splits(holdout))
