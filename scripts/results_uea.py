"""The entry point of :mod:`primal_attention.studies.uea` (docs/results/uea.md); ``--help`` lists its options."""

from primal_attention.studies.uea import main

if __name__ == "__main__":
    main()
