"""The entry point of :mod:`primal_attention.studies.lm` (docs/results/lm.md); ``--help`` lists its options."""

from primal_attention.studies.lm import main

if __name__ == "__main__":
    main()
