"""The entry point of :mod:`primal_attention.studies.ksvd` (docs/results/ksvd.md); ``--help`` lists its options."""

from primal_attention.studies.ksvd import main

if __name__ == "__main__":
    main()
