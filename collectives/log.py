"""Logging: one logger per layer, ``collectives`` here and ``pooltensor`` above (children such
as ``pooltensor.serve`` under it). The library prints nothing itself but warnings that say
what to do; everything else goes to these loggers, silent unless the application configures
logging or $POOLTENSOR_LOG names a level (debug, info, warning, error): then one handler on
stderr for both, each line with this process's rank and host.

At debug level: the bootstrap, the transport chosen for each peer, tcp listeners and
connections, collective calls given up (timeouts, lost peers) and every change in a link's
native counters (connects, reconnects, retries, timeouts, errors, losses: a watcher thread
reads them once a second while a world is open).
"""
import logging
import os
import sys
import threading

ENV = "POOLTENSOR_LOG"
logger = logging.getLogger("collectives")
_where = {"rank": "-", "host": "-"}
_configured = False


class _Where(logging.Filter):
    """Puts this process's rank and host on every record (as %(rank)s, %(host)s)."""

    def filter(self, record):
        record.rank = _where["rank"]
        record.host = _where["host"]
        return True


def configure(environ=None):
    """Apply $POOLTENSOR_LOG once per process (ValueError for a level logging lacks)."""
    global _configured
    if _configured:
        return
    _configured = True
    level = (environ or os.environ).get(ENV, "").strip()
    if not level:
        return
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"{ENV}={level!r}: use debug, info, warning or error")
    h = logging.StreamHandler(sys.stderr)
    h.addFilter(_Where())
    h.setFormatter(logging.Formatter(
        "%(asctime)s %(name)s [rank %(rank)s %(host)s] %(levelname)s: %(message)s"))
    for name in ("collectives", "pooltensor"):
        lg = logging.getLogger(name)
        lg.addHandler(h)
        lg.setLevel(value)


def set_where(rank, host):
    """The rank and host the log lines carry from now on."""
    _where["rank"], _where["host"] = rank, host


def watch_links(world, interval=1.0):
    """At debug level, a daemon thread that logs each change of a link's native event
    counters (collectives/counters.py) until the world closes; otherwise nothing."""
    if not logger.isEnabledFor(logging.DEBUG):
        return None

    def loop():
        last = {}
        stop = world._watch_stop
        while not stop.wait(interval):
            try:
                _, links = world._ctx.stats()
            except Exception:          # closed under us
                return
            for link in links:
                r, ev = link["peer"], link["events"]
                before = last.get(r, {})
                for k, v in ev.items():
                    if v != before.get(k, 0):
                        logger.debug("link to rank %d (%s, %s): %s %d -> %d%s", r,
                                     world.hosts[r], link["transport"] or "unreached", k,
                                     before.get(k, 0), v,
                                     f"; last error: {link['last_error']} in "
                                     f"{link['last_error_op']}" if link["last_error"] and
                                     k in ("errors", "timeouts", "lost") else "")
                last[r] = dict(ev)
    world._watch_stop = threading.Event()
    t = threading.Thread(target=loop, name="collectives-links", daemon=True)
    t.start()
    return t
