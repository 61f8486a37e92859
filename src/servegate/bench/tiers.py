"""The bench's prompt-size tiers (a leaf: the config checks names against it)."""

from __future__ import annotations

#: 8k-128k are the field's tiers; 1k-4k are for smoke-sized runs (demos, CI)
TIERS = {
    "1k": 1024,
    "2k": 2048,
    "4k": 4096,
    "8k": 8192,
    "16k": 16384,
    "32k": 32768,
    "64k": 65536,
    "128k": 131072,
}
