"""The entry point of :mod:`primal_attention.studies.lra` (docs/results/lra.md); ``--help`` lists its options."""

from primal_attention.studies.lra import main

if __name__ == "__main__":
    main()
