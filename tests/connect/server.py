"""A Spark Connect server on loopback for the tests (``make test-connect``): the
``SparkConnectServer`` of the installed pyspark (its ``spark-connect`` jar), started with its
own ``spark-submit`` in a process group of its own and stopped by its pid, like the
standalone cluster's daemons (``tests/cluster/standalone.py``).

It binds to 127.0.0.1 on a free port, runs ``local[2]``, and gets a clean environment: no
PYTHONPATH, the venv's Python for its Python workers (``PYSPARK_PYTHON``). The job's code
reaches those workers the way it reaches any server's: the session adds the ``make
package`` zip (``jobs.session.ship_code``).
"""

from __future__ import annotations

import atexit
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

from tests.cluster.standalone import LOOPBACK, Daemon, clean_env, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 180


@dataclass
class ConnectServer:
    """``with ConnectServer(folder) as server:`` starts the server, waits until it answers
    on ``server.url``, and always stops it on leaving (also at the process's exit)."""

    folder: Path
    master: str = "local[2]"
    driver_memory: str = "2g"
    port: int = 0
    daemon: Daemon | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self) -> ConnectServer:
        atexit.register(self.stop)  # also when the test process is interrupted
        spark_home = Path(pyspark.__file__).resolve().parent
        self.port = free_port()
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / "connect-server.log"
        argv = [
            str(spark_home / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            self.master,
            "--driver-memory",
            self.driver_memory,
            "--conf",
            f"spark.connect.grpc.binding.address={LOOPBACK}",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={self.folder / 'tmp'}",
            "spark-internal",
        ]
        env = clean_env(spark_home, self.folder, PYSPARK_PYTHON=sys.executable)
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                cwd=self.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped by its pid
            )
        self.daemon = Daemon("connect-server", process, log)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Until the server answers on its port (a gRPC channel that becomes ready)."""
        import grpc

        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.daemon is not None
        while time.monotonic() < deadline:
            if not self.daemon.alive():
                raise RuntimeError(
                    f"the Spark Connect server exited with {self.daemon.process.returncode}:\n"
                    f"{self.daemon.tail()}"
                )
            channel = grpc.insecure_channel(f"{LOOPBACK}:{self.port}")
            try:
                grpc.channel_ready_future(channel).result(timeout=2)
                return
            except grpc.FutureTimeoutError:
                continue
            finally:
                channel.close()
        raise RuntimeError(
            f"the Spark Connect server did not answer on {self.url} within"
            f" {START_TIMEOUT_S} s:\n{self.daemon.tail()}"
        )

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()

    def __enter__(self) -> ConnectServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    """``python -m tests.connect.server FOLDER``: start a server, print its URL, keep it
    until Ctrl-C or SIGTERM (bench and manual checks; the tests use the class)."""
    import signal

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "build/connect-server").resolve()

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    with ConnectServer(folder) as server:
        print(server.url, flush=True)
        try:
            while server.daemon is not None and server.daemon.alive():
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
