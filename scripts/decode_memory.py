"""The entry point of :mod:`primal_attention.studies.decode_memory` (docs/results/decode_memory.md); ``--help`` lists its options."""

from primal_attention.studies.decode_memory import main

if __name__ == "__main__":
    main()
