"""The studies behind docs/results: each module declares its grid, runs it (resumable, stored as JSON
under docs/results) and writes its page. They need a checkout of the repository (:mod:`.paths`); the
scripts in ``scripts/`` are their entry points, e.g. ``python scripts/results_lm.py --table-only``.

* :mod:`.comparison`: the shared model: comparison entries, trivial baselines, verdicts, tuned sections;
* :mod:`.sweeps`: the fair comparisons (per-model rate sweeps selected on validation, final seeds);
* pages: :mod:`.lm`, :mod:`.lra`, :mod:`.uea`, :mod:`.vision`, :mod:`.rl`, :mod:`.summary` (README),
  :mod:`.conversion` (convert.md), :mod:`.ksvd`, :mod:`.spectrum`;
* measurements: :mod:`.perf_check`, :mod:`.decode_memory`, :mod:`.hf_decode_memory`,
  :mod:`.vision_scaling`, :mod:`.bench_compare`.

Nothing in the library imports this package.
"""
