"""A bucket's storage: KvTablet, its rows in RocksDB, the write buffer and memory budget, the
Arrow changelog that is also its write-ahead log, retention and the entries replicated to
followers. Only servers and tests import it; clients never do."""
