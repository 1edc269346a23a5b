"""Benchmark harness of rmq-txn-reconcile (`make bench`, `python -m bench.run`)."""
