"""The entry point of :mod:`primal_attention.studies.vision_scaling` (the vision scaling measurements); ``--help`` lists its options."""

from primal_attention.studies.vision_scaling import main

if __name__ == "__main__":
    main()
