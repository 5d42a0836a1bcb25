"""The table model: schemas with aggregate columns, table descriptors and their options, merge
modes, the changelog's change types and hidden columns. The lowest layer of the engine:
declaring a table needs nothing above it."""
