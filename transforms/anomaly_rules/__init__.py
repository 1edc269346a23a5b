"""The anomaly rules (docs/spec/anomalies.md), one module per family of what they read:
``evidence`` (the frames every rule reads and the ``ANOMALY`` contract each ends in),
``pending`` (the check and re-check rules over the pending records), ``producer``
(``slow_producer``), ``op_queue`` (the op queue's backlog, gaps and 4.9 stall) and
``cross_run`` (``stalled_offset``). ``transforms.anomalies`` assembles them."""
