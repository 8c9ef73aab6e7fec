"""weir's agents; ``weir.app.main`` imports the ones ``WEIR_AGENTS`` selects."""

if __name__ == "agents":  # imported by its short name from a checkout: the same modules as weir.agents (weir._checkout)
    from weir._checkout import alias

    alias(__name__)
