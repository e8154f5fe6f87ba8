"""Bytes only: the answers the proxy writes itself (``answers``), the client's response head built from a
replica's (``heads``), the paths and their checks (``routes``) and one parsed request (``request``).
Nothing here holds a connection; the layers above import this one, never the reverse."""
from .answers import CONTINUE, LAST_CHUNK, answer, chunk, error_answer, status_line

__all__ = ["CONTINUE", "LAST_CHUNK", "answer", "chunk", "error_answer", "status_line"]
