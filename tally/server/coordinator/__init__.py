"""The coordinator's side: the catalog, replica placement and control, lake and snapshot
registries, restores, consumer positions and option changes. It never imports the tablet
server's side: the two speak only over Flight."""
