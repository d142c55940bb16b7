"""The entry point of :mod:`primal_attention.studies.spectrum` (docs/results/spectrum.md); ``--help`` lists its options."""

from primal_attention.studies.spectrum import main

if __name__ == "__main__":
    main()
