"""The hash of a config: a key-sorted JSON form and its sha256, from which every cell key is made.

    python -c "from harness.config.hashing import config_hash; print(config_hash({'a': 1}))"

Changing either function changes every cell key (tests/unit/workflow/test_grid.py holds them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def canonical(obj: Any) -> Any:
    """A JSON-able, key-sorted form of a config (pydantic models, tuples, paths)."""
    if isinstance(obj, BaseModel):
        return canonical(obj.model_dump(mode="json"))
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot hash a {type(obj).__name__} into a config key")


def config_hash(obj: Any) -> str:
    """sha256 of the key-sorted JSON of `obj` (equal to hashing `canonical(obj)`)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(blob.encode()).hexdigest()
