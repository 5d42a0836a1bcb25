"""The tablet server's side: its buckets' tablets, leadership and followers, lookups, part
reads, retention, expiry, storage health and snapshot uploads and loads. It never imports the
coordinator's side: the two speak only over Flight."""
