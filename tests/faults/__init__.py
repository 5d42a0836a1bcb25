"""The fault harness of issue 37: real server processes, real faults, a hypothesis schedule of
them against writers with and without column locks, judged by a plain-Python oracle. See
docs/reliability.md."""
