"""`tally demo`: the end-to-end exactly-once demo (a cluster, a Spark streaming job, a crash)."""
