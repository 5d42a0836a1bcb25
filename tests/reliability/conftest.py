"""The reliability suite reuses the cluster tests' fixtures (one definition, in
tests/cluster/conftest.py): a module-scoped LocalCluster per metadata store, `conn`, `table_name`.
"""

from tests.cluster.conftest import cluster, conn, secured_cluster, table_name  # noqa: F401
