"""Search strategies, executors, the run loop and the results store (import as einspace.search)."""
