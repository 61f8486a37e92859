"""GPU architecture names that exist, to catch a typo in the config before a long build.

A leaf module: the config, the build and the inspector all check names here, and it
imports nothing of servegate but its errors.
"""

from __future__ import annotations

from servegate.errors import ConfigError

#: architectures that exist, to catch a typo in the config before a long build
AMD_ARCHS = frozenset(
    [
        "gfx803",
        "gfx900",
        "gfx902",
        "gfx906",
        "gfx908",
        "gfx909",
        "gfx90a",
        "gfx90c",
        "gfx940",
        "gfx941",
        "gfx942",
        "gfx950",
        "gfx1010",
        "gfx1011",
        "gfx1012",
        "gfx1013",
        "gfx1030",
        "gfx1031",
        "gfx1032",
        "gfx1033",
        "gfx1034",
        "gfx1035",
        "gfx1036",
        "gfx1100",
        "gfx1101",
        "gfx1102",
        "gfx1103",
        "gfx1150",
        "gfx1151",
        "gfx1152",
        "gfx1200",
        "gfx1201",
    ]
)
NVIDIA_ARCHS = frozenset(
    f"sm_{n}"
    for n in [
        "50",
        "52",
        "53",
        "60",
        "61",
        "62",
        "70",
        "72",
        "75",
        "80",
        "86",
        "87",
        "89",
        "90",
        "90a",
        "100",
        "100a",
        "100f",
        "101",
        "101a",
        "103",
        "103a",
        "110",
        "110a",
        "120",
        "120a",
        "121",
        "121a",
    ]
)


def check_arch_names(archs: tuple[str, ...]) -> None:
    for arch in archs:
        base = arch.split(":")[0]
        if base not in AMD_ARCHS and base not in NVIDIA_ARCHS:
            raise ConfigError(
                f"GPU architecture {arch!r} does not exist",
                hint="AMD: gfx1030 (V620/RX 6800), gfx90a, gfx942 …; NVIDIA: sm_80, sm_90 …",
            )
