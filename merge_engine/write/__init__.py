"""Write input: the rows of a write checked against the table, their encoded keys, the
aggregate states they fold into, and the compiled groupers; the pre-aggregation a client or a
Spark task runs before it sends (no storage here)."""
