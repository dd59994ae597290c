"""Bundled grammar files (`einspace.pcfg` is the paper's space) and seed trees."""
