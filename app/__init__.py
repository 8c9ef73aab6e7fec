"""weir: coordination patterns for Kafka on Faust; ``app.main`` (``weir.app.main``) is the worker entry point."""

if __name__ == "app":  # imported by its short name from a checkout: the same modules as weir.app (weir._checkout)
    from weir._checkout import alias

    alias(__name__)
