"""The row format: the codec of a stored row, the visible row a lookup answers, and the images
an undo writes back from changelog records."""
