"""The resource's ``status.rl``, from the router pods' /status ``rl`` sections.

The pods of one fleet share the RL state (each change carries an epoch), so the
pod reporting the newest epoch speaks for them all; only the pins cleared are
summed (by ``status.summarize``, with the other counters), as each pod clears its own.
"""
from __future__ import annotations

import datetime
from typing import Any

from .spec import Rl


def parse(section: object) -> dict[str, Any]:
    """One pod's ``rl`` section, reduced to what the status shows; anything malformed counts as absent."""
    if not isinstance(section, dict):
        return {}
    epoch = section.get("epoch")
    last = section.get("last")
    last = last if isinstance(last, dict) else {}
    pause, update = last.get("pause") or {}, last.get("update") or {}
    cleared = section.get("pinsCleared", 0)
    return {
        "epoch": (epoch[0], str(epoch[1])) if isinstance(epoch, list) and len(epoch) == 2
        and isinstance(epoch[0], int) else (0, ""),
        "weight_version": _text(section.get("weightVersion")),
        "paused": section.get("paused") is True,
        "last_pause": _text(pause.get("outcome")) if isinstance(pause, dict) else None,
        "last_update": _text(update.get("outcome")) if isinstance(update, dict) else None,
        "last_update_at": _when(update.get("at")) if isinstance(update, dict) else None,
        "pins_cleared": cleared if isinstance(cleared, int) and not isinstance(cleared, bool) and cleared >= 0 else 0,
    }


def summarize(sections: list[dict[str, Any]], pins_cleared: int) -> Rl:
    """The newest pod's state, with ``pins_cleared`` summed over the pods by the caller (gone pods included)."""
    reported = [section for section in sections if section]
    if not reported:
        return Rl(pins_cleared=pins_cleared)
    newest = max(reported, key=lambda section: section["epoch"])
    fields = {key: value for key, value in newest.items() if key not in ("epoch", "pins_cleared")}
    return Rl(**fields, pins_cleared=pins_cleared)


def _text(value: object) -> str | None:
    return value[:200] if isinstance(value, str) else None


def _when(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return datetime.datetime.fromtimestamp(value, datetime.UTC).isoformat().replace("+00:00", "Z")
