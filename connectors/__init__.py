"""Input and output connectors.

``WRITERS`` lives here, free of pyarrow and deltalake, so that the configuration can check
``--writer`` without importing the writers themselves.
"""

WRITERS = ("auto", "delta-spark", "delta-rs")  # --writer: which Delta writer (connectors.delta)
