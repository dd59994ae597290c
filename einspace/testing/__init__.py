"""Yardsticks for tests and benchmarks: hand-written plain-torch models of the bundled seeds
(`einspace.testing.reference_models`). Not used by the engine itself."""
