"""The names of the hidden columns that travel beside a table's own columns.

Writers may send `_unwritten`, `_contributions` and `_change_type` with their rows; changelog
readers get `_offset`, `_change_type`, `_unwritten`, `_contributions`, `_tokens` and (tables
with a sequence field) `_sequences` with every image, and readers across buckets `_partition` and `_bucket` too. One place names them, so the engine, the client, the changelog and the test model can
never disagree on a spelling.
"""

OFFSET = "_offset"              # changelog: the record's offset
CHANGE_TYPE = "_change_type"    # +I, -U, +U, -D (writes: -U/-D retract a contribution)
CHANGE_CODE = "_change"         # the stored form of the change type (an int8 code)
UNWRITTEN = "_unwritten"        # per row, the columns an image leaves unwritten
CONTRIBUTIONS = "_contributions"  # per row, how many contributions counted cells hold
TOKENS = "_tokens"              # the tokens of string_agg states a joined string cannot tell apart
SEQUENCES = "_sequences"        # the states (value and sequence) of sequence-ordered cells
PARTITION = "_partition"        # changelog readers: the record's partition name (null: none)
BUCKET = "_bucket"              # changelog readers: the record's bucket
# Tables with a row TTL (`table.kv.row-ttl`) only:
WRITTEN_MS = "_written_ms"      # per image, when its key was last written (ms); undo writes it back
EXPIRED = "_expired"            # true on the -D records the row TTL wrote (not a delete)

ALL = (OFFSET, CHANGE_TYPE, CHANGE_CODE, UNWRITTEN, CONTRIBUTIONS, TOKENS, SEQUENCES, PARTITION,
       BUCKET, WRITTEN_MS, EXPIRED)
