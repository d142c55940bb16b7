"""The entry point of :mod:`primal_attention.studies.conversion` (docs/results/convert.md); ``--help`` lists its options."""

from primal_attention.studies.conversion import main

if __name__ == "__main__":
    main()
