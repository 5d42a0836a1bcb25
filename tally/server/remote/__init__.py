"""Remote storage of bucket snapshots: files, changelog segments and manifests, shared by the
tablet server (which uploads and loads them) and the coordinator (which registers them)."""
