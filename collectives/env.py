"""Numbers read from POOLTENSOR_* environment variables.

One reading for every knob: an empty value counts as unset (as the native layer reads its
own), and a value that is not a number is named in the error, not left to a bare int()
traceback from deep inside an import."""
import os


def number(name, default, kind=int):
    """$name as kind (int or float), default when unset or empty; ValueError naming the
    variable when it is neither."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"environment variable {name}={raw!r} is not {what}") from None


def progress_threads():
    """Progress threads of a native context ($POOLTENSOR_PROGRESS_THREADS)."""
    return number("POOLTENSOR_PROGRESS_THREADS", 1)


# Numbers that only the native layer reads, with atol/atof: those take "1M" for 1 and "x" for 0
# without a word. Checked once, as the native module loads, so a wrong one is named like the
# rest (POOLTENSOR_TIMEOUT is the rendezvous' to check; the one-shot limit the algorithms').
NATIVE = {"POOLTENSOR_TEAM_CMA_MIN": int, "POOLTENSOR_TEAM_CMA_ALLREDUCE_MIN": int,
          "POOLTENSOR_TEAM_CMA_MAX": int, "POOLTENSOR_TCP_STRIPES": int,
          "POOLTENSOR_TCP_STRIPE_PART": int, "POOLTENSOR_TCP_SOCKBUF": int,
          "POOLTENSOR_STATS_SAMPLE": int, "POOLTENSOR_SPIN_US": float,
          "POOLTENSOR_VERBS_RAILS": int, "POOLTENSOR_VERBS_GID": int}


def check_native():
    """ValueError naming the first of NATIVE set to something that is not a number."""
    for name, kind in NATIVE.items():
        number(name, None, kind)
