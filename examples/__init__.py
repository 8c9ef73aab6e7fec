"""Small programs built on weir: the split/aggregate demo (``make demo-split``), its item step, an end-of-stream job."""
