"""Tally's metadata stores: where the coordinator keeps what it must not forget.

`open_store(zookeeper=..., data_dir=...)` picks ZooKeeper when a connect string is given, else
the embedded store in `<data_dir>/meta`. Both implement `MetadataStore` (tally.meta.store). This
package sits below the coordinator and the lock service and knows nothing about tables: it stores
JSON documents at paths.
"""

from __future__ import annotations

import os

from tally.meta.store import MetadataStore, Node, join_path, node_name, split_path, text_of

__all__ = ["MetadataStore", "Node", "open_store", "join_path", "node_name", "split_path",
           "text_of"]


def open_store(zookeeper: str | None = None, data_dir: str | None = None) -> MetadataStore:
    """A ZooKeeperStore for `zookeeper` ('host:port[/chroot]'), else an EmbeddedStore in data_dir."""
    if zookeeper:
        from tally.meta.zookeeper import ZooKeeperStore

        return ZooKeeperStore(zookeeper)
    if not data_dir:
        raise ValueError("the embedded metadata store needs a data directory")
    from tally.meta.embedded import EmbeddedStore

    return EmbeddedStore(os.path.join(data_dir, "meta"))
