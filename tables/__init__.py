"""weir's tables: each module holds a table's typed value and its pure state core."""
