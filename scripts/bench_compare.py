"""The entry point of :mod:`primal_attention.studies.bench_compare` (comparing two primal bench JSON files); ``--help`` lists its options."""

from primal_attention.studies.bench_compare import main

if __name__ == "__main__":
    main()
