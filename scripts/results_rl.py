"""The entry point of :mod:`primal_attention.studies.rl` (docs/results/rl.md); ``--help`` lists its options."""

from primal_attention.studies.rl import main

if __name__ == "__main__":
    main()
