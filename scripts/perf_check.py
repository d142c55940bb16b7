"""The entry point of :mod:`primal_attention.studies.perf_check` (the speed targets of docs/results/efficiency.md); ``--help`` lists its options."""

from primal_attention.studies.perf_check import main

if __name__ == "__main__":
    raise SystemExit(main())
