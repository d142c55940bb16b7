"""The entry point of :mod:`primal_attention.studies.summary` (docs/results/README.md); ``--help`` lists its options."""

from primal_attention.studies.summary import main

if __name__ == "__main__":
    main()
