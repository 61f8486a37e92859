"""Rebuild (or check) servegate's bench fixtures from real text on this machine.

regular: the Python documentation's topic texts (pydoc_data, PSF-2.0) and licence
texts (verbatim, as their licences allow); coding: CPython standard-library modules
(PSF-2.0). The output is byte-for-byte reproducible from the same Python version, and
its SHA-256 is locked in src/servegate/bench/fixtures/FIXTURES.json, which the bench
checks before every run.

    python tools/make_fixtures.py          # check the committed fixtures
    python tools/make_fixtures.py --write  # rewrite them (then commit)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import pydoc_data.topics
import sys
import sysconfig
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "servegate" / "bench" / "fixtures"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
LICENCES = Path("/usr/share/common-licenses")

CODE_MODULES = [
    "argparse.py",
    "dataclasses.py",
    "difflib.py",
    "functools.py",
    "json/decoder.py",
    "json/encoder.py",
    "pathlib.py",
    "shutil.py",
    "subprocess.py",
    "textwrap.py",
    "ast.py",
    "configparser.py",
]
LICENCE_TEXTS = ["GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1"]


def _sources() -> dict[str, list[tuple[str, str, str]]]:
    """profile -> [(name, licence, text)]"""
    topics = pydoc_data.topics.topics
    regular = [
        (
            f"Python {sys.version_info.major}.{sys.version_info.minor} documentation: {k}",
            "PSF-2.0",
            topics[k].strip() + "\n",
        )
        for k in sorted(topics)
    ]
    regular += [
        (
            f"licence text {name}",
            f"{name} (verbatim copying permitted)",
            (LICENCES / name).read_text(),
        )
        for name in LICENCE_TEXTS
    ]
    coding = [
        (
            f"CPython {sys.version_info.major}.{sys.version_info.minor} Lib/{m}",
            "PSF-2.0",
            (STDLIB / m).read_text(),
        )
        for m in CODE_MODULES
    ]
    return {"regular": regular, "coding": coding}


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as f:
        f.write(data)
    return buf.getvalue()


def build() -> tuple[dict[str, bytes], dict[str, object]]:
    files: dict[str, bytes] = {}
    manifest: dict[str, object] = {"schema": 1, "fixtures": {}}
    for profile, parts in _sources().items():
        sep = "\n\n" if profile == "regular" else "\n\n# ----\n\n"
        text = sep.join(t for _, _, t in parts)
        raw = text.encode()
        packed = _gzip(raw)
        files[f"{profile}.txt.gz"] = packed
        manifest["fixtures"][profile] = {  # type: ignore[index]
            "file": f"{profile}.txt.gz",
            "sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw),
            "gzip_ratio": round(len(packed) / len(raw), 4),
            "sources": [
                {
                    "name": n,
                    "licence": lic,
                    "bytes": len(t.encode()),
                    "sha256": hashlib.sha256(t.encode()).hexdigest(),
                }
                for n, lic, t in parts
            ],
        }
    return files, manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    files, manifest = build()
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    if args.write:
        OUT.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (OUT / name).write_bytes(data)
        (OUT / "FIXTURES.json").write_text(text)
        print(f"wrote {', '.join(files)} and FIXTURES.json to {OUT}")
        return 0
    locked = json.loads((OUT / "FIXTURES.json").read_text())
    same = all(
        locked["fixtures"][p]["sha256"] == manifest["fixtures"][p]["sha256"]  # type: ignore[index]
        for p in ("regular", "coding")
    )
    print("fixtures match this machine's sources" if same else "fixtures differ from the sources")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
