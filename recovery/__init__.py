"""Undo recovery: roll a writer's columns back to a baseline offset from the changelog."""

from recovery.undo import BucketUndo, UndoResult, undo_bucket

__all__ = ["BucketUndo", "UndoResult", "undo_bucket"]
