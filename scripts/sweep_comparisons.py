"""The entry point of :mod:`primal_attention.studies.sweeps` (the fair comparisons: per-model rate sweeps and final seeds); ``--help`` lists its options."""

from primal_attention.studies.sweeps import main

if __name__ == "__main__":
    main()
