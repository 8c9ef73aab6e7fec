"""The shop's tables, each with its web view (their values' types and cores are in ``shop.state``)."""
