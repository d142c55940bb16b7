"""Models built from the attention layers: blocks, a sequence classifier, a causal LM."""
