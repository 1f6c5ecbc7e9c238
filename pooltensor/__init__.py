"""pooltensor: the global pool and the distributed array (built on collectives)."""
__version__ = "0.1.0"
