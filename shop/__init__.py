"""The ice-cream shop (seed 002): order screens, a payment gateway, kitchen robots, a dispatch barrier, end-of-day
reports, built on weir as any user would build on it. ``shop.main`` is its worker entry, ``shop.demo`` what
``make demo`` runs."""
