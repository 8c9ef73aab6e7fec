"""weir: coordination patterns for Kafka on Faust; ``app.main`` is the worker entry point."""
