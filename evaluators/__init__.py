"""Evaluators that turn a tree into a fitness: training, zero-cost proxies, datasets, budgets."""
