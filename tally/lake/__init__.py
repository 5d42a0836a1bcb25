"""Tiering into the lakehouse: each lake-enabled table copied into a Delta Lake table,
committed epochs only, exactly once (the `tally tier` process), and reads of the lake copy."""

from tally.lake.lake_reads import UnionPlan, read_lake, read_union, union_plan
from tally.lake.tier_service import TierService

__all__ = ["TierService", "UnionPlan", "read_lake", "read_union", "union_plan"]
