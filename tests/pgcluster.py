"""Private PostgreSQL clusters for the failover tests: a primary, a streaming replica made
with ``pg_basebackup``, a SIGKILL of the whole primary and a promotion.

Each cluster lives in a temporary directory and listens on 127.0.0.1 on a port of
:data:`PORTS` (never the shared server's). Run as root (CI), the server programs run as the
``postgres`` user, which owns the directory (``initdb`` refuses to run as root). The server
programs are PostgreSQL's ``initdb``, ``pg_basebackup`` and ``postgres`` from
:func:`server_bindir`: ``DL_PG_BINDIR`` when set, else those of the shared server's major
version under ``/usr/lib/postgresql/<major>/bin`` (Debian), else ``pg_config --bindir``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg

#: The ports private clusters may listen on.
PORTS = range(5441, 5450)

#: Settings every private cluster gets: small, quick, and logging to its own file. ``fsync``
#: is off: the tests kill processes, never the machine, so what a process wrote survives it.
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "'16MB'",
    "max_connections": "40",
    "fsync": "off",
    "full_page_writes": "off",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "wal_keep_size": "'64MB'",
    "hot_standby": "on",
    "wal_receiver_status_interval": "'1s'",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


def server_bindir(major: int | None = None) -> Path | None:
    """The directory of ``initdb``, ``pg_basebackup`` and ``postgres``, or ``None`` when this
    machine has no PostgreSQL server programs (``major``: the version to prefer)."""
    wanted = os.environ.get("DL_PG_BINDIR")
    candidates = [Path(wanted)] if wanted else []
    if major is not None:
        candidates.append(Path(f"/usr/lib/postgresql/{major}/bin"))
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        candidates.append(Path(found))
    candidates.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
    for path in candidates:
        if all((path / program).is_file() for program in ("initdb", "pg_basebackup", "postgres")):
            return path
    return None


def _free_port(taken: set[int]) -> int:
    for port in PORTS:
        if port in taken:
            continue
        with socket.socket() as probe:
            # As the server binds it: a port left in TIME_WAIT by a stopped server is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"No free port among {PORTS.start}-{PORTS.stop - 1} for a private cluster")


def _as_server_user() -> dict[str, Any]:
    """``subprocess`` arguments that run a server program as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def _dies_with_us() -> Any:
    """A ``preexec_fn`` asking Linux to stop the server (SIGQUIT: immediate shutdown) when the
    thread that started it ends, so a test process killed outright leaves no server behind.
    ``None`` elsewhere than Linux."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def setup() -> None:
        prctl(1, int(signal.SIGQUIT), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGQUIT)

    return setup


class Cluster:
    """One private PostgreSQL server: its data directory under ``root``, its port, its log.

    Made by :class:`Clusters` (which owns the temporary directory and stops every server it
    started)."""

    def __init__(self, clusters: Clusters, name: str, port: int) -> None:
        self.clusters = clusters
        self.name = name
        self.port = port
        self.datadir = clusters.root / name
        self.log = clusters.root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    # -- running ---------------------------------------------------------------------------

    def start(self, settings: Mapping[str, str] | None = None) -> Cluster:
        """Start the server with :data:`BASE_SETTINGS` and ``settings`` (values are written
        as given into ``postgresql.auto.conf``'s place: ``-c name=value``), wait until it
        answers; returns ``self``."""
        options = {**BASE_SETTINGS, "port": str(self.port), **(settings or {})}
        options["unix_socket_directories"] = f"'{self.clusters.root}'"
        args = [str(self.clusters.bindir / "postgres"), "-D", str(self.datadir)]
        for name, value in options.items():
            args += ["-c", f"{name}={value.strip(chr(39))}"]
        log = open(self.log, "ab")  # noqa: SIM115 - the server's stderr for its whole life
        try:
            self.process = subprocess.Popen(
                args,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_dies_with_us(),
                **_as_server_user(),
            )
        finally:
            log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server accepts connections (a standby's too); fail with its log."""
        give_up = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_text()}")
            try:
                with self.connect(connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > give_up:
                    raise RuntimeError(f"{self.name} never answered:\n{self.log_text()}") from None
                time.sleep(0.05)

    def log_text(self) -> str:
        """The server's log so far (for a failure message)."""
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def connect(self, dbname: str = "postgres", **options: Any) -> psycopg.Connection[Any]:
        """A psycopg connection (autocommit) to the server as ``postgres``."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=dbname,
            autocommit=True,
            **options,
        )

    def execute(self, sql: str, params: Any = None, dbname: str = "postgres") -> list[Any]:
        """Run ``sql`` on a fresh connection; its rows (empty when it returns none)."""
        with self.connect(dbname) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def children(self) -> list[int]:
        """The pids of the server's processes other than the postmaster (``/proc``)."""
        assert self.process is not None
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            if ppid == self.process.pid:
                found.append(int(entry.name))
        return found

    def kill(self) -> None:
        """SIGKILL the server and every one of its processes at once (as a crashed machine
        would end them): the postmaster is stopped first so that it starts no other."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        for pid in self.children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """Stop the server at once (immediate shutdown) if it runs; no-op otherwise."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGQUIT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()

    def promote(self) -> None:
        """Promote this standby (``pg_promote``, waiting until it accepts writes)."""
        with self.connect() as conn:
            (done,) = conn.execute("SELECT pg_promote(true, 60)").fetchone()  # type: ignore[misc]
        if not done:
            raise RuntimeError(f"{self.name} was not promoted:\n{self.log_text()}")

    def walsender_pids(self) -> list[int]:
        """The pids of this primary's WAL senders (one per connected standby)."""
        return [row[0] for row in self.execute("SELECT pid FROM pg_stat_replication")]


class Clusters:
    """Private clusters in one temporary directory; a context manager that stops them all and
    removes the directory.

    Args:
        bindir: the server programs (:func:`server_bindir`).
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="dl-failover-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.made: list[Cluster] = []
        self._template: Path | None = None

    def __enter__(self) -> Clusters:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every server started here and remove the directory."""
        for cluster in self.made:
            with contextlib.suppress(Exception):
                cluster.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            cwd=self.root,
            **_as_server_user(),
        )
        if done.returncode:
            raise RuntimeError(f"{args[0]} failed: {done.stderr.decode(errors='replace')}")

    def _new(self, name: str) -> Cluster:
        # A port is taken while its cluster runs, or is made but not started yet.
        taken = {c.port for c in self.made if c.process is None or c.process.poll() is None}
        cluster = Cluster(self, name, _free_port(taken))
        self.made.append(cluster)
        return cluster

    def primary(self, name: str = "primary") -> Cluster:
        """A new, empty cluster (not started). ``initdb`` runs once per :class:`Clusters`;
        later ones copy its result."""
        cluster = self._new(name)
        if self._template is None:
            self._template = self.root / "template"
            self._run("initdb", "-D", str(self._template), "-U", "postgres", "-A", "trust", "-N")
        self._copy(self._template, cluster.datadir)
        return cluster

    def standby_of(self, primary: Cluster, name: str = "standby") -> Cluster:
        """A streaming standby of the running ``primary`` (``pg_basebackup -R``: it connects
        back as ``application_name`` = ``name``), not started."""
        cluster = self._new(name)
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(cluster.datadir),
            "-X",
            "stream",
            "-R",
            "-c",
            "fast",
        )
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        with open(cluster.datadir / "postgresql.auto.conf", "a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        return cluster

    def _copy(self, source: Path, target: Path) -> None:
        if os.geteuid() == 0:
            subprocess.run(["cp", "-a", str(source), str(target)], check=True)
        else:
            shutil.copytree(source, target, symlinks=True)


@contextlib.contextmanager
def private_clusters(bindir: Path) -> Iterator[Clusters]:
    """:class:`Clusters` as a ``with`` block."""
    with Clusters(bindir) as clusters:
        yield clusters
