"""The C++ core's folders form one order, and includes only run down it.

The order, lowest first (csrc/README.md says what each folder holds):

    include < base < backends < collectives < negotiation | p2p < exec < runtime < (csrc/ itself: c_api.cc)

A file may include a file of its own folder or of a folder below it;
negotiation and p2p share a level and do not include each other. The folder
of a file is the first part of its path under csrc/ (backends/mpi and
backends/shm are both "backends"); files directly in csrc/ are the top.
Every quoted include must name a file of csrc/ or csrc/include/. No csrc
file (.cc/.h) exceeds MAX_LINES lines. Plain parsing: no compiler.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
MAX_LINES = 450
# Folder -> level; equal levels are siblings (neither includes the other).
LEVELS = {
    "include": 0,
    "base": 1,
    "backends": 2,
    "collectives": 3,
    "negotiation": 4,
    "p2p": 4,
    "exec": 5,
    "runtime": 6,
    "": 7,  # csrc/c_api.cc
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".cc", ".h"))


def _folder(path: Path) -> str:
    parts = path.relative_to(CSRC).parts
    return parts[0] if len(parts) > 1 else ""


def _resolve(name: str) -> Path | None:
    for base in (CSRC, CSRC / "include"):
        if (base / name).is_file():
            return base / name
    return None


def test_every_folder_has_a_level():
    folders = {_folder(p) for p in _sources()}
    assert folders <= set(LEVELS), f"csrc folders without a level in LEVELS: {sorted(folders - set(LEVELS))}"


def test_includes_run_down_only():
    wrong = []
    for path in _sources():
        mine = _folder(path)
        for name in INCLUDE.findall(path.read_text()):
            target = _resolve(name)
            rel = path.relative_to(CSRC)
            if target is None:
                wrong.append(f"{rel}: includes \"{name}\", which is not a file of csrc/")
                continue
            theirs = _folder(target)
            if theirs == mine:
                continue
            if LEVELS.get(theirs, 99) >= LEVELS.get(mine, -1):
                wrong.append(f"{rel} ({mine or 'csrc'}) includes {target.relative_to(CSRC)} ({theirs}): "
                             "not below it")
    assert not wrong, "upward or sideways includes:\n" + "\n".join(wrong)


def test_no_file_over_max_lines():
    long = [f"{p.relative_to(CSRC)}: {n} lines" for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"csrc files over {MAX_LINES} lines (split them by role):\n" + "\n".join(long)
