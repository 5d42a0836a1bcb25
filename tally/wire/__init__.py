"""The wire: what clients, the Spark sink and servers must agree on byte for byte.

`messages` frames requests and errors for Arrow Flight, `channel` speaks them, `bucket_hash`
is the stable bucket function and `routing` the partition and bucket of a row. Both sides of
every hop import these, so they live below the client and the server and import neither.
"""
