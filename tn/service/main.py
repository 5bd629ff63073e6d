"""`kwal tn run` (or `python -m tn.service.main`): the TN process.

Opens the configured log backend (cfg.wal.backend: kafka | file | memory),
rebuilds the engine from the newest checkpoint plus the WAL after it, makes sure the topics exist,
runs checkpoints and the compaction policy in the background, answers `kwal ops` commands
on the ops topic, and serves requests until SIGTERM or SIGINT, then drains in-flight commits,
publishes their results and closes the log. Prints one line
``kwal-tn ready <requests topic>`` on stderr once it is consuming.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from infra.collector import freeze_startup_heap, raise_young_threshold
from infra.config import KwalConfig
from tn.logstore.driver import LogDriver, LogFencedError, LogStore

logger = logging.getLogger("kwal.tn.main")


def open_driver(cfg: KwalConfig) -> LogDriver:
    backend = cfg.wal.backend
    if backend == "memory":
        from tn.logstore.memory_backend import MemoryDriver

        return MemoryDriver()
    if backend == "file":
        from tn.logstore.file_backend import FileDriver

        return FileDriver(
            cfg.wal.dir,
            segment_bytes=cfg.wal.segment_bytes,
            recovery_mode=cfg.wal.recovery_mode,
            group_max_entries=cfg.wal.group_max_entries,
            group_max_bytes=cfg.wal.group_max_bytes,
        )
    if backend == "kafka":
        from tn.logstore.kafka_backend import KafkaDriver

        return KafkaDriver(cfg)
    raise ValueError(f"unknown wal.backend {backend!r} (file | kafka | memory)")


def _status_publisher(cfg: KwalConfig, log: LogStore) -> Any:
    """Report the Kafka WAL writer's state (window occupancy) for `kwal ops status`."""
    from tn.logstore.kafka_backend import KafkaDriver
    from tn.service.status_publisher import StatusPublisher

    driver = log.driver
    if not isinstance(driver, KafkaDriver):
        return None

    def status() -> dict[str, Any]:
        st = driver.status()
        in_flight = int(st["last_lsn"]) - int(st["acked_lsn"])  # type: ignore[call-overload]
        return {**st, "window": cfg.wal.window, "in_flight": in_flight}

    return StatusPublisher(cfg, status).start()


REOPEN_BACKOFF_S = (1.0, 2.0, 5.0)  # between attempts to reopen a failed log; then 5 s each
FENCED_EXIT = 3  # the exit status of a TN whose log a newer TN took over
FAILED_CLOSE_S = 1.0  # how long a part may wait on Kafka while closing after a log failure


def run(args: Any, cfg: KwalConfig) -> int:
    """Serve until a signal; reopen the log (in this process) each time it fails.

    1. open the log and recover the engine, the logtail and the checkpoints, start the
       service (`_serve`); a failure here on the first start is the exit status;
    2. the log fails (the service halts, see `TnService` "A log failure"): tear all
       of it down, wait a moment (longer while reopening keeps failing: the broker may
       still be away) and go to 1 with a new writer epoch. A writer fenced by a newer
       one exits (status FENCED_EXIT) instead: reopening would fence that one in turn.
    """
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from infra.metrics import METRICS
    from infra.metrics import serve as serve_metrics

    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if cfg.tn.metrics_port:
        serve_metrics(cfg.tn.metrics_port)
    reopens = 0  # reopen attempts since the last successful start
    started = False
    while not stop.is_set():
        try:
            outcome = _serve(cfg, stop)
        except Exception as e:
            if not started:
                raise
            delay = REOPEN_BACKOFF_S[min(reopens, len(REOPEN_BACKOFF_S) - 1)]
            reopens += 1
            logger.warning("reopening the log failed (%s); trying again in %.0f s", e, delay)
            stop.wait(delay)
            continue
        if isinstance(outcome, int):
            return outcome
        started, reopens = True, 0
        fenced = isinstance(outcome.__cause__, LogFencedError)
        METRICS.log_failures.labels("fenced" if fenced else "failed").inc()
        if cfg.wal.backend == "memory":  # reopening would start from an empty log
            print(f"kwal-tn: the in-memory log failed: {outcome}", file=sys.stderr, flush=True)
            return 1
        if fenced:
            print(f"kwal-tn: fenced by a newer TN, exiting: {outcome}", file=sys.stderr, flush=True)
            return FENCED_EXIT
        delay = REOPEN_BACKOFF_S[0]
        logger.error("the log failed (%s); reopening it in %.0f s on a new epoch", outcome, delay)
        gc.unfreeze()  # the old incarnation's heap is garbage now
        stop.wait(delay)
    return 0


def _serve(cfg: KwalConfig, stop: threading.Event) -> int | BaseException:
    """One incarnation: open, recover, serve. Returns the exit status once `stop` is set
    (or 1 when a service thread died), or the log failure that halted the service."""
    from infra.topics import ensure_topics
    from schemas.codec import decode_entry
    from tn.checkpoint.policy import CompactionPolicy
    from tn.checkpoint.scheduler import start_compaction
    from tn.checkpoint.wiring import recover_from_config, start_checkpoints
    from tn.logtail.wiring import attach_logtail
    from tn.service.metrics_sampler import MetricsSampler
    from tn.service.ops_listener import OpsListener
    from tn.service.service import TnService

    ensure_topics(cfg)
    # After a log failure the parts close without waiting on Kafka: the broker may still be
    # away, and a producer that met a fatal error delivers nothing more (each waited out its
    # whole timeout: 15 s of a reopen). Nothing is lost by it: the next incarnation
    # publishes the logtail of every entry in the WAL again, and the status at its interval.
    def patience(timeout_s: float) -> float:
        return FAILED_CLOSE_S if engine.log_failure is not None else timeout_s

    # Each part is closed, in reverse order, however this incarnation ends: also when a
    # later part fails to start, which on a reopen must not leave the earlier ones running.
    with ExitStack() as parts:
        log = LogStore(open_driver(cfg))
        parts.callback(log.close)
        recovered = recover_from_config(log, cfg)
        engine = recovered.engine
        parts.callback(engine.close)
        # Where the WAL is fenced at the broker, results and logtail ride the same
        # transactional producer (docs/fencing.md): nothing a replaced TN writes is read.
        bus = getattr(log.driver, "bus", None)
        logtail = attach_logtail(
            engine,
            cfg,
            republish=(decode_entry(r.payload) for r in log.records()),
            producer=bus.channel() if bus is not None else None,
        )
        parts.callback(lambda: logtail.close(patience(10.0)))
        checkpoints = start_checkpoints(recovered, cfg, logtail=logtail)
        parts.callback(checkpoints.stop)
        compaction = start_compaction(
            engine,
            recovered.store,
            CompactionPolicy.from_config(cfg.compaction),
            cfg.compaction.interval_s,
            exclusive=checkpoints.exclusive,
            publish=logtail.publisher.publish_records,
        )
        parts.callback(compaction.stop)
        ops = OpsListener(cfg, compaction).start()
        parts.callback(ops.stop)
        sampler = MetricsSampler(log, checkpoints, logtail.publisher, cfg.tn.metrics_interval_s)
        parts.callback(sampler.start().stop)
        service = TnService(
            cfg,
            engine,
            store=recovered.store,
            producer=bus.channel() if bus is not None else None,
        )
        gateway = None
        if cfg.security.enabled:  # per-principal topics in and out (docs/security.md)
            from tn.service.gateway import PrincipalGateway

            gateway = PrincipalGateway(cfg).start()
            parts.callback(lambda: gateway.stop(patience(10.0)) if gateway is not None else None)
        status = _status_publisher(cfg, log)
        if status is not None:
            parts.callback(lambda: status.stop(patience(5.0)))
        freeze_startup_heap()
        raise_young_threshold()
        service.start()
        print(f"kwal-tn ready {cfg.topics.requests}", file=sys.stderr, flush=True)
        while not stop.wait(0.2):
            failure = service.log_failure
            if failure is not None:
                service.stop()
                return failure
            if not service.healthy() or (gateway is not None and not gateway.healthy()):
                print("kwal-tn: a service thread died", file=sys.stderr, flush=True)
                return 1
        service.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tn.service.main", description="run the TN")
    parser.add_argument("--config", help="TOML config file")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers")
    args = parser.parse_args(argv)
    cfg = KwalConfig.load(args.config)
    if args.bootstrap:
        cfg = cfg.with_bootstrap(args.bootstrap)
    return run(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
