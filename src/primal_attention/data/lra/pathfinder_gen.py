"""Pathfinder (Linsley et al. 2018; Kim et al. 2020) images as used by the Long Range Arena.

Each image shows two *target* contours, a few shorter *distractor* contours and two round markers.
Label 1: the markers sit on the two ends of the same target contour. Label 0: one marker sits on the
start of one target contour, the other on the end of the other target contour. To tell them apart a
model has to follow a contour across the image.

What is implemented (numpy only, vectorised over a batch of images), and how it relates to LRA's
Pathfinder-32, generated with ``snakes2.py`` from github.com/drewlinsley/pathfinder:

* A contour is a chain of ``contour_length`` straight *paddles* (dashes) ``paddle_length`` pixels long.
  Consecutive pivots are ``paddle_length + 2 * paddle_margin`` apart and each paddle leaves
  ``paddle_margin`` free at both ends, so dashes are separated by gaps of about ``2 * paddle_margin``
  (``snakes.extend_snake``'s geometry). ``paddle_margin=0`` gives solid contours.
* Each paddle turns by Δ relative to the previous one. Δ is drawn with density ∝ cos²(min(|Δ|·c, π/2))
  (c = ``continuity``), **restricted to the turns that fit**, like ``snakes.get_coords_cmf``. In practice:
  a jittered fan of ``candidates`` turns is tested and one that fits is drawn by weight.
* The two targets start ``seed_distance`` apart near the centre (LRA keeps the first seed
  ``2 * seed_distance`` from the border) and grow alternately. When a target is stuck it backtracks
  (``backtrack`` paddles, at most ``max_backtracks`` times); an image whose targets still cannot be
  completed is discarded and a new one drawn. A distractor that gets stuck is dropped and tried
  elsewhere, at most 3 times (LRA: ``allow_incomplete``).
* Different contours and markers never touch. Each pixel that one contour lights is at Chebyshev
  distance >= 2 from every pixel that another contour or another contour's marker lights, so at least
  one dark pixel separates them. With ``paddle_margin=0``, then, the 8-connected components of the lit
  pixels are exactly the contours (with their markers), and the label is exactly "both markers lie in
  one component". A contour keeps the same distance from its own paddles, except the newest. With
  dashes (the default), faint anti-aliased pixels often, but not always, link consecutive dashes: the
  markers of a positive are then usually joined by lit pixels, and those of a negative never are.
* Distractors: ``num_distractors`` contours of ``distractor_length`` paddles. The defaults follow
  LRA-32: ``distractor_length = contour_length // 3`` and ``num_distractors = 20 // distractor_length``.
* Anti-aliased rendering. A paddle lights pixel p with ``clip(line_radius - d, 0, 1)``, where d is the
  distance from p's centre to the segment. A marker lights it with
  ``clip(marker_radius + 0.5 - d, 0, 1)``, d measured from the marker's centre. Grey levels run 0–255
  on a black background.
* Speed on one CPU core: 10k images in about 12 s (easy), 15 s (intermediate) and 30 s (hard).

Difficulties are named after LRA's folders: ``easy`` = ``curv_baseline`` (contour length 6),
``intermediate`` = ``curv_contour_length_9`` and ``hard`` = ``curv_contour_length_14``. The pixels are
not LRA's: the rasteriser differs, coordinates are continuous rather than snapped to pixels, there is no
lanczos resize, and contours are kept strictly apart. Accuracies here are comparable in kind, not
number for number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["DIFFICULTIES", "LRA_FOLDERS", "PathfinderConfig", "generate_pathfinder"]

DIFFICULTIES = {"easy": 6, "intermediate": 9, "hard": 14}
"""Difficulty name → target contour length (paddles)."""

LRA_FOLDERS = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}
"""Contour length → folder name in LRA's ``pathfinder32`` release."""

_CHUNK = 512  # images per random stream: the output does not depend on num_examples
_FREE = np.int16(np.iinfo(np.int16).max)  # grid value of a cell no paddle occupies
_ANY = _FREE - 1  # test threshold at which every occupied cell blocks
_FIRST_TRIES = 4  # candidates tested before testing all of them


@dataclass(frozen=True)
class PathfinderConfig:
    """Generation parameters, lengths in pixels. Defaults: LRA Pathfinder-32, hard (contour length 14)."""

    image_size: int = 32
    contour_length: int = 14
    paddle_length: float = 2.0
    paddle_margin: float = 1.0
    continuity: float = 1.0
    seed_distance: float = 7.0
    marker_radius: float = 1.5
    line_radius: float = 1.0
    distractor_length: int | None = None
    num_distractors: int | None = None
    candidates: int = 24
    backtrack: int = 2
    max_backtracks: int = 12
    max_redraws: int = 30

    def __post_init__(self) -> None:
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if self.contour_length < 1 or self.paddle_length <= 0 or self.paddle_margin < 0:
            raise ValueError(f"need contour_length >= 1, paddle_length > 0 and paddle_margin >= 0, got "
                             f"{self.contour_length}, {self.paddle_length}, {self.paddle_margin}")
        if self.continuity <= 0 or self.candidates < 1 or self.line_radius <= 0 or self.marker_radius <= 0:
            raise ValueError(f"need continuity, candidates, line_radius and marker_radius > 0, got "
                             f"{self.continuity}, {self.candidates}, {self.line_radius}, {self.marker_radius}")
        if self.backtrack < 1 or self.max_backtracks < 0 or self.max_redraws < 1:
            raise ValueError(f"need backtrack >= 1, max_backtracks >= 0 and max_redraws >= 1, got "
                             f"{self.backtrack}, {self.max_backtracks}, {self.max_redraws}")

    @property
    def n_distractor_paddles(self) -> int:
        return self.distractor_length if self.distractor_length is not None else max(1, self.contour_length // 3)

    @property
    def n_distractors(self) -> int:
        return self.num_distractors if self.num_distractors is not None else 20 // self.n_distractor_paddles

    def key(self) -> dict:
        """The parameters that determine the images (for cache keys)."""
        d = asdict(self)
        d["distractor_length"] = self.n_distractor_paddles
        d["num_distractors"] = self.n_distractors
        return d


def _unit(theta: np.ndarray) -> np.ndarray:
    return np.stack([np.sin(theta), np.cos(theta)], -1)


class _Canvas:
    """Geometry and drawing for one batch, on grids padded so that object windows never leave the array.

    Occupancy grids are int16 ``(B, P, P)``: a cell holds the index of the earliest paddle of its contour
    whose lit pixels, grown by one pixel (3×3), cover it, or ``_FREE``. A test ``(grid, threshold)``
    blocks a candidate that lights a cell whose value is <= threshold (per row).
    """

    def __init__(self, cfg: PathfinderConfig, batch: int, rng: np.random.Generator):
        self.cfg, self.rng, self.batch = cfg, rng, batch
        self.h = cfg.image_size
        reach = max(cfg.paddle_length + 2 * cfg.line_radius, 2 * (cfg.marker_radius + 0.5))
        self.win = int(np.ceil(reach)) + 2  # window side that holds every lit pixel of an object
        self.pad = self.win + 3
        self.side = self.h + 2 * self.pad
        self.image = np.zeros((batch, self.side, self.side), np.float32)
        self.offsets = np.arange(self.win)
        half = min(np.pi, np.pi / (2 * cfg.continuity))  # the continuity density is 0 beyond this
        self.fan_step = 2 * half / cfg.candidates
        self.fan = -half + self.fan_step * np.arange(cfg.candidates)
        # Own paddles this recent are exempt from the own-contour test: they necessarily come close.
        self.delay = max(1, int(np.ceil(4.0 / (cfg.paddle_length + 2 * cfg.paddle_margin))))

    def grid(self) -> np.ndarray:
        return np.full((self.batch, self.side, self.side), _FREE, np.int16)

    def turn_fan(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(n, K)`` candidate turns and their weights cos²(min(|Δ|·c, π/2))."""
        turns = self.fan + self.rng.uniform(0, self.fan_step, size=(n, 1))
        return turns, np.cos(np.minimum(np.abs(turns) * self.cfg.continuity, np.pi / 2)) ** 2

    def objects(self, p0: np.ndarray, p1: np.ndarray, radius: float) -> dict:
        """Windows of the capsules p0→p1 (``(N, 2)``, (y, x)): pixels whose centre is within ``radius``."""
        p0 = p0.astype(np.float32)
        p1 = p1.astype(np.float32)
        lo = np.floor(np.minimum(p0, p1) - radius).astype(np.int64)
        off = self.offsets.astype(np.float32) + 0.5
        ry = lo[:, 0, None].astype(np.float32) + off - p0[:, 0, None]  # (N, S): rows minus p0
        rx = lo[:, 1, None].astype(np.float32) + off - p0[:, 1, None]
        v = p1 - p0
        inv = 1.0 / np.maximum((v * v).sum(1), 1e-12)
        t = (ry * (v[:, 0] * inv)[:, None])[:, :, None] + (rx * (v[:, 1] * inv)[:, None])[:, None, :]
        np.clip(t, 0.0, 1.0, out=t)
        dy = ry[:, :, None] - t * v[:, 0, None, None]
        dx = rx[:, None, :] - t * v[:, 1, None, None]
        d2 = dy * dy + dx * dx
        origin = np.clip(lo + self.pad, 1, self.side - self.win - 1)
        return {"origin": origin, "lit": d2 < radius * radius, "d2": d2, "radius": radius}

    def _index(self, origin: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        r = np.arange(size)
        return (origin[:, 0, None] + r)[:, :, None], (origin[:, 1, None] + r)[:, None, :]

    def fits(self, p0: np.ndarray, p1: np.ndarray, radius: float, rows: np.ndarray,
             tests: list[tuple[np.ndarray, np.ndarray | int]]) -> np.ndarray:
        """Which capsules stay inside the image and light no cell blocked by ``tests`` (see class doc).

        The border test is conservative: a capsule must stay ``radius - 0.5`` inside the edges. A
        capsule whose centre line passes through a blocked cell lights that cell, which rejects most
        candidates before their windows are computed.
        """
        ok = ((np.minimum(p0, p1) >= radius - 0.5) & (np.maximum(p0, p1) <= self.h - 0.5 - radius)).all(1)
        tests = [(g, np.broadcast_to(np.asarray(t, np.int64), rows.shape)) for g, t in tests]
        for w in (0.0, 0.5, 1.0):
            q = np.clip(np.floor((1 - w) * p0 + w * p1).astype(np.int64) + self.pad, 0, self.side - 1)
            for g, thr in tests:
                ok &= g[rows, q[:, 0], q[:, 1]] > thr
        idx = np.flatnonzero(ok)
        if idx.size:
            obj = self.objects(p0[idx], p1[idx], radius)
            yy, xx = self._index(obj["origin"], self.win)
            r = rows[idx, None, None]
            hit = np.zeros(idx.size, bool)
            for g, thr in tests:
                hit |= ((g[r, yy, xx] <= thr[idx, None, None]) & obj["lit"]).any((1, 2))
            ok[idx[hit]] = False
        return ok

    def occupy(self, obj: dict, rows: np.ndarray, grid: np.ndarray, value: np.ndarray | int) -> None:
        """Stamp ``value`` on the lit pixels of ``obj`` grown by one pixel, keeping smaller stamps.

        One object per row (rows unique), so the fancy-indexed update has no duplicates.
        """
        lit, s = obj["lit"], self.win
        grown = np.zeros((lit.shape[0], s + 2, s + 2), bool)
        for dy in range(3):
            for dx in range(3):
                grown[:, dy:dy + s, dx:dx + s] |= lit
        yy, xx = self._index(obj["origin"] - 1, s + 2)
        idx = (rows[:, None, None], yy, xx)
        stamp = np.broadcast_to(np.asarray(value, np.int16), rows.shape)[:, None, None]
        grid[idx] = np.minimum(grid[idx], np.where(grown, stamp, _FREE))

    def draw(self, obj: dict, rows: np.ndarray) -> None:
        """Paint ``obj`` (one per row, rows unique), keeping the brighter value per pixel."""
        yy, xx = self._index(obj["origin"], self.win)
        idx = (rows[:, None, None], yy, xx)
        value = np.clip(obj["radius"] - np.sqrt(obj["d2"]), 0.0, 1.0)
        self.image[idx] = np.maximum(self.image[idx], value)

    def crop(self) -> np.ndarray:
        p, h = self.pad, self.h
        return self.image[:, p:p + h, p:p + h]


class _Contour:
    """One contour per image of a batch: paddle history, and an occupancy grid (see :class:`_Canvas`)."""

    def __init__(self, cv: _Canvas, length: int):
        b = cv.batch
        self.cv, self.length = cv, length
        self.start = np.zeros((b, length, 2))
        self.head = np.zeros((b, length, 2))
        self.pivot = np.zeros((b, length, 2))
        self.theta = np.zeros((b, length))
        self.n = np.zeros(b, np.int64)  # paddles placed
        self.grid = cv.grid()

    @property
    def tip(self) -> np.ndarray:
        """``(B, 2)``: where the contour starts (its first paddle's tail, the origin marker's centre)."""
        return self.start[:, 0]

    @property
    def end(self) -> np.ndarray:
        """``(B, 2)``: the head of the newest paddle."""
        return self.head[np.arange(self.cv.batch), np.maximum(self.n - 1, 0)]

    def _place(self, rows: np.ndarray, start: np.ndarray, head: np.ndarray, pivot: np.ndarray,
               theta: np.ndarray) -> None:
        i = self.n[rows]
        self.start[rows, i], self.head[rows, i] = start, head
        self.pivot[rows, i], self.theta[rows, i] = pivot, theta
        self.cv.occupy(self.cv.objects(start, head, self.cv.cfg.line_radius), rows, self.grid, i)
        self.n[rows] += 1

    def seed(self, rows: np.ndarray, tail: np.ndarray, theta: np.ndarray, tests: list, with_marker: bool
             ) -> np.ndarray:
        """First paddle (and origin marker): the first of ``(len(rows), K)`` candidates that fits.

        Returns True where one fits. Candidates are tested a few at a time, since the first usually fits.
        """
        cfg, cv = self.cv.cfg, self.cv
        n, k = theta.shape
        choice = np.full(n, -1)
        for lo, hi in ((0, min(k, _FIRST_TRIES)), (min(k, _FIRST_TRIES), k)):
            sub = np.flatnonzero(choice < 0)
            if sub.size == 0 or lo >= hi:
                continue
            t = tail[sub, lo:hi].reshape(-1, 2)
            th = theta[sub, lo:hi].reshape(-1)
            rr = np.repeat(rows[sub], hi - lo)
            ok = cv.fits(t, t + cfg.paddle_length * _unit(th), cfg.line_radius, rr, tests)
            if with_marker:
                ok &= cv.fits(t, t, cfg.marker_radius + 0.5, rr, tests)
            ok = ok.reshape(sub.size, hi - lo)
            found = ok.any(1)
            choice[sub[found]] = lo + ok[found].argmax(1)
        good = choice >= 0
        rows_ok = rows[good]
        t = tail[good, choice[good]]
        th = theta[good, choice[good]]
        self._place(rows_ok, t, t + cfg.paddle_length * _unit(th), t - cfg.paddle_margin * _unit(th), th)
        if with_marker:
            cv.occupy(cv.objects(t, t, cfg.marker_radius + 0.5), rows_ok, self.grid, 0)
        return good

    def extend(self, rows: np.ndarray, tests: list) -> np.ndarray:
        """One more paddle per row, avoiding ``tests`` and the own older paddles; True where one fits.

        The turn is drawn from the fan's weights restricted to the turns that fit: first by rejection
        (a few weighted draws, the first that fits), then, for the rows where none did, by testing the
        whole fan. Both stages sample the same restricted distribution.
        """
        cfg, cv = self.cv.cfg, self.cv
        k, n = cfg.candidates, rows.size
        last = self.n[rows] - 1
        pitch = cfg.paddle_length + 2 * cfg.paddle_margin
        pivot = self.pivot[rows, last] + pitch * _unit(self.theta[rows, last])
        turns, weight = cv.turn_fan(n)
        theta = self.theta[rows, last][:, None] + turns

        def fitting(sub: np.ndarray, idx: np.ndarray) -> np.ndarray:
            m = idx.shape[1]
            th = np.take_along_axis(theta[sub], idx, 1).reshape(-1)
            pv = np.repeat(pivot[sub], m, axis=0)
            u = _unit(th)
            own = np.repeat(last[sub] - cv.delay, m)
            return cv.fits(pv + cfg.paddle_margin * u, pv + (cfg.paddle_margin + cfg.paddle_length) * u,
                           cfg.line_radius, np.repeat(rows[sub], m), tests + [(self.grid, own)]
                           ).reshape(sub.size, m)

        cdf = np.cumsum(weight, 1)
        cdf /= cdf[:, -1:]
        draws = np.minimum((cdf[:, None, :] <= cv.rng.uniform(size=(n, _FIRST_TRIES, 1))).sum(-1), k - 1)
        ok = fitting(np.arange(n), draws)
        choice = np.where(ok.any(1), np.take_along_axis(draws, ok.argmax(1)[:, None], 1)[:, 0], -1)
        rest = np.flatnonzero(choice < 0)
        if rest.size:
            ok = fitting(rest, np.broadcast_to(np.arange(k), (rest.size, k)))
            cum = np.cumsum(weight[rest] * ok, axis=1)
            found = cum[:, -1] > 1e-9
            pick = np.minimum((cum <= (cv.rng.uniform(size=rest.size) * cum[:, -1])[:, None]).sum(1), k - 1)
            choice[rest[found]] = pick[found]
        good = choice >= 0
        th = theta[good, choice[good]]
        u = _unit(th)
        pv = pivot[good]
        self._place(rows[good], pv + cfg.paddle_margin * u, pv + (cfg.paddle_margin + cfg.paddle_length) * u,
                    pv, th)
        return good

    def revert(self, rows: np.ndarray, keep: np.ndarray) -> None:
        """Drop all but the first ``keep`` paddles of each row (the origin marker stays with paddle 0)."""
        if rows.size == 0:
            return
        g = self.grid[rows]
        g[g >= keep[:, None, None]] = _FREE
        self.grid[rows] = g
        self.n[rows] = keep

    def blocking(self) -> tuple[np.ndarray, int]:
        """A test that blocks every cell of this contour (for other contours)."""
        return self.grid, _ANY

    def render(self, keep: np.ndarray, show_marker: np.ndarray | None = None) -> None:
        """Draw the paddles of the rows where ``keep``, and the origin marker where also ``show_marker``."""
        cv, cfg = self.cv, self.cv.cfg
        for i in range(self.length):
            rows = np.flatnonzero(keep & (self.n > i))
            if rows.size:
                cv.draw(cv.objects(self.start[rows, i], self.head[rows, i], cfg.line_radius), rows)
        if show_marker is not None:
            rows = np.flatnonzero(keep & show_marker)
            if rows.size:
                cv.draw(cv.objects(self.tip[rows], self.tip[rows], cfg.marker_radius + 0.5), rows)


def _targets(cv: _Canvas) -> tuple[_Contour, _Contour, np.ndarray]:
    """Grow the two target contours in every image; returns them and which images succeeded."""
    cfg, rng, k, batch = cv.cfg, cv.rng, cv.cfg.candidates, cv.batch
    h, length = cfg.image_size, cfg.contour_length
    rows = np.arange(batch)
    a, b = _Contour(cv, length), _Contour(cv, length)
    margin = min(2 * cfg.seed_distance, (h - 1) / 2)
    tail_a = np.repeat(rng.uniform(margin, h - margin, size=(batch, 1, 2)), k, axis=1)
    live = a.seed(rows, tail_a, rng.uniform(-np.pi, np.pi, size=(batch, k)), [], True)
    phi = rng.uniform(-np.pi, np.pi, size=(batch, k))
    tail_b = a.tip[:, None, :] + cfg.seed_distance * _unit(phi)
    seeded = b.seed(rows[live], tail_b[live], rng.uniform(-np.pi, np.pi, size=(int(live.sum()), k)),
                    [a.blocking()], True)
    live[np.flatnonzero(live)[~seeded]] = False
    stuck = np.zeros(batch, np.int64)
    for _ in range(2 * length + cfg.max_backtracks):
        if not (live & ((a.n < length) | (b.n < length))).any():
            break
        for me, other in ((a, b), (b, a)):
            rows = np.flatnonzero(live & (me.n < length))
            if rows.size == 0:
                continue
            grew = me.extend(rows, [other.blocking()])
            bad = rows[~grew]
            stuck[bad] += 1
            live[bad[stuck[bad] > cfg.max_backtracks]] = False
            retry = bad[stuck[bad] <= cfg.max_backtracks]
            me.revert(retry, np.maximum(1, me.n[retry] - cfg.backtrack))
    return a, b, live & (a.n == length) & (b.n == length)


def _distractors(cv: _Canvas, occupied: np.ndarray, active: np.ndarray) -> None:
    """Add distractor contours to the images where ``active``; ``occupied`` (a grid) is updated."""
    cfg, rng, k, batch = cv.cfg, cv.rng, cv.cfg.candidates, cv.batch
    h = cfg.image_size
    for _ in range(cfg.n_distractors):
        todo = active.copy()
        for _attempt in range(3):
            rows = np.flatnonzero(todo)
            if rows.size == 0:
                break
            c = _Contour(cv, cfg.n_distractor_paddles)
            tests = [(occupied, _ANY)]
            ok = c.seed(rows, rng.uniform(0, h, size=(rows.size, k, 2)),
                        rng.uniform(-np.pi, np.pi, size=(rows.size, k)), tests, False)
            for _ in range(cfg.n_distractor_paddles - 1):
                live = rows[ok]
                ok[np.flatnonzero(ok)[~c.extend(live, tests)]] = False
            done = np.zeros(batch, bool)
            done[rows[ok]] = True
            c.render(done)
            np.minimum(occupied, np.where(done[:, None, None] & (c.grid < _FREE), 0, _FREE).astype(np.int16),
                       out=occupied)
            todo &= ~done


def _attempt(cfg: PathfinderConfig, labels: np.ndarray, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Try to draw one image per label; returns which succeeded, the images and the marker centres."""
    n = labels.size
    radius = cfg.marker_radius + 0.5
    cv = _Canvas(cfg, n, rng)
    a, b, ok = _targets(cv)
    # Markers: the start of one target, and the end of the same one (label 1) or of the other (0).
    first = rng.integers(0, 2, size=n)
    last = np.where(labels == 1, first, 1 - first)
    origin = np.where(first[:, None] == 0, a.tip, b.tip)
    terminal = np.where(last[:, None] == 0, a.end, b.end)
    foreign = np.where((last == 0)[:, None, None], b.grid, a.grid)
    ok &= cv.fits(terminal, terminal, radius, np.arange(n), [(foreign, _ANY)])
    occupied = np.where((a.grid < _FREE) | (b.grid < _FREE), 0, _FREE).astype(np.int16)
    sel = np.flatnonzero(ok)
    marker = cv.objects(terminal[sel], terminal[sel], radius)
    cv.occupy(marker, sel, occupied, 0)
    cv.draw(marker, sel)
    a.render(ok, show_marker=first == 0)
    b.render(ok, show_marker=first == 1)
    _distractors(cv, occupied, ok)
    images = np.round(np.clip(cv.crop(), 0, 1) * 255).astype(np.uint8)
    return ok, images, np.stack([origin, terminal], 1)


def _chunk(cfg: PathfinderConfig, batch: int, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``batch`` images, exactly half of each label, in random order."""
    need = {0: batch - batch // 2, 1: batch // 2}
    got: dict[int, list] = {0: [], 1: []}
    rate = 0.5
    for _ in range(cfg.max_redraws):
        missing = {c: need[c] - sum(len(g[0]) for g in got[c]) for c in (0, 1)}
        if max(missing.values()) <= 0:
            break
        # Draw more than missing (success rate seen so far), so that few rounds are needed.
        labels = np.concatenate([np.full(min(4 * batch, int(np.ceil(max(m, 0) * 1.15 / rate)) + 4 * (m > 0)), c)
                                 for c, m in missing.items()]).astype(np.int64)
        ok, images, markers = _attempt(cfg, labels, rng)
        rate = max(0.05, min(1.0, ok.mean()))
        for c in (0, 1):
            sel = np.flatnonzero(ok & (labels == c))
            got[c].append((images[sel], markers[sel]))
    else:
        raise RuntimeError(f"Pathfinder: images could not be drawn in {cfg.max_redraws} rounds: the contours "
                           f"do not fit in a {cfg.image_size}px image ({cfg})")
    images = np.concatenate([np.concatenate([g[0] for g in got[c]])[: need[c]] for c in (0, 1)])
    markers = np.concatenate([np.concatenate([g[1] for g in got[c]])[: need[c]] for c in (0, 1)])
    labels = np.repeat(np.array([0, 1], np.int64), [need[0], need[1]])
    order = rng.permutation(batch)
    return images[order], labels[order], markers[order]


def generate_pathfinder(num_examples: int, *, seed: int | tuple[int, ...] = 0,
                        config: PathfinderConfig | None = None, progress: bool = False,
                        return_markers: bool = False):
    """Generate Pathfinder images.

    Args:
        num_examples: number of images M.
        seed: an int or a tuple of ints (e.g. ``(seed, split_index)``). The images depend on (seed, config)
            only, and the first M of a larger set are the same images.
        config: generation parameters (default: LRA Pathfinder-32, contour length 14).
        progress: show a progress bar (tqdm).
        return_markers: also return the marker centres.

    Returns:
        ``images`` ``(M, S, S)`` uint8 and ``labels`` ``(M,)`` int64 (1 = both markers on one contour;
        each block of 512 is exactly balanced). With ``return_markers``, also a ``(M, 2, 2)`` float array
        of marker centres as (y, x), pixel centres at half-integers: [origin, terminal].
    """
    cfg = config or PathfinderConfig()
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    chunks = range(-(-num_examples // _CHUNK))
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, disable=None, desc=f"Pathfinder-{cfg.image_size}, contour length {cfg.contour_length}",
                      unit="block")
    entropy = list(seed) if isinstance(seed, tuple) else [seed]
    parts = [_chunk(cfg, _CHUNK, np.random.default_rng(np.random.SeedSequence([*entropy, i]))) for i in chunks]
    s = cfg.image_size
    images = np.concatenate([p[0] for p in parts] or [np.zeros((0, s, s), np.uint8)])[:num_examples]
    labels = np.concatenate([p[1] for p in parts] or [np.zeros(0, np.int64)])[:num_examples]
    if return_markers:
        markers = np.concatenate([p[2] for p in parts] or [np.zeros((0, 2, 2))])[:num_examples]
        return images, labels, markers
    return images, labels
