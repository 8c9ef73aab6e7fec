"""weir's tables: each module holds a table's typed value and its pure state core."""

if __name__ == "tables":  # imported by its short name from a checkout: the same modules as weir.tables (weir._checkout)
    from weir._checkout import alias

    alias(__name__)
