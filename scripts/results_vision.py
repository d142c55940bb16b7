"""The entry point of :mod:`primal_attention.studies.vision` (docs/results/vision.md); ``--help`` lists its options."""

from primal_attention.studies.vision import main

if __name__ == "__main__":
    main()
