"""weir's agents; ``app.main`` imports the ones ``WEIR_AGENTS`` selects."""
