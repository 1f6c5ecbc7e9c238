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
