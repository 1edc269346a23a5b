"""The bare-Spark anchor of ``bench.small``: what Spark itself costs a process like the
job's, with nothing of the job on top.

``python -m bench.bare_spark`` starts a session exactly as the job does (``build_session``
with the packaged defaults: master, shuffle partitions, driver memory), runs one trivial
Spark job and stops. The job's wall and CPU time over this process's are what the job
adds on top of Spark's start.
"""

from __future__ import annotations

from jobs.config import load_config
from jobs.session import build_session


def main() -> None:
    config = load_config(None, {})
    spark = build_session(
        master=config.master,
        shuffle_partitions=config.shuffle_partitions,
        driver_memory=config.driver_memory,
    )
    spark.range(1).count()  # one trivial job: the session is really up, executors included
    spark.stop()


if __name__ == "__main__":
    main()
