"""The core's configuration table (csrc/base/config.cc) and README's
"Configuration" table list the same variables with the same defaults, and
the table is the only place in the core that reads the environment."""
import re
from pathlib import Path

import commlib.config

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"COMMLIB_[A-Z0-9_]+")


def readme_tables():
    """The rows of each table in README's "## Configuration" section, as
    (variable cell, default cell) pairs, one list per table."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    tables, current = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "variable":
            current = []
            tables.append(current)
        elif current is not None and not set(cells[0]) <= {"-"}:
            current.append((cells[0], cells[1]))
    return tables


def readme_names():
    """Every variable named in README's configuration tables."""
    return {n for table in readme_tables() for var, _ in table for n in NAME.findall(var)}


def first_code(cell):
    if cell == "empty (off)" or cell.startswith("set by "):  # a path's or a token's default: unset
        return ""
    found = re.search(r"`([^`]*)`", cell)
    assert found, f"no `value` in README cell {cell!r}"
    return found.group(1)


def test_readme_table_matches_core_table():
    core = [(e.name, e.default) for e in commlib.config.table()]
    readme = [(first_code(var), first_code(default)) for var, default in readme_tables()[0]]
    assert readme == core


def test_table_entries_are_complete():
    entries = commlib.config.table()
    assert len({e.name for e in entries}) == len(entries)
    for e in entries:
        assert NAME.fullmatch(e.name), e
        assert e.accepted and e.meaning, e
        # only a path or a token another program sets may default to unset
        assert e.default or e.accepted in ("a path", "up to 32 hex digits"), e
        commlib.config.check(e.name, e.default)  # every default is a valid value


def test_p2p_and_test_variables_are_in_the_table():
    defaults = {e.name: e.default for e in commlib.config.table()}
    assert defaults["COMMLIB_P2P_EAGER_BYTES"] == "65536"
    assert defaults["COMMLIB_P2P_SPLIT_BYTES"] == "262144"
    assert defaults["COMMLIB_P2P_SINGLE_COPY"] == "1"
    assert "COMMLIB_TEST_RANKS_PER_HOST" in defaults


def sources(*dirs, suffixes):
    for d in dirs:
        for path in sorted((REPO / d).rglob("*")):
            if path.suffix in suffixes and path.is_file():
                yield path


def test_only_config_cc_reads_the_environment():
    readers = [str(p.relative_to(REPO)) for p in sources("csrc", suffixes={".cc", ".h", ".cpp"})
               if re.search(r"getenv|\benviron\b", p.read_text())]
    assert readers == ["csrc/base/config.cc"]


def test_every_variable_named_in_the_core_is_in_the_table():
    core = set(commlib.config.names())
    named = set()
    for path in sources("csrc", suffixes={".cc", ".h"}):
        named |= {m for m in re.findall(r'"(COMMLIB_[A-Z0-9_]+)"', path.read_text())}
    assert named <= core, named - core


def test_every_variable_python_reads_is_in_readme():
    in_readme = readme_names()
    read = set()
    for path in sources("commlib", "frontends", "bindings", suffixes={".py"}):
        read |= set(re.findall(r"""["'](COMMLIB_[A-Z0-9_]+)["']""", path.read_text()))
    assert read, "no COMMLIB_ names found in the Python sources"
    assert read <= in_readme, read - in_readme


def test_readme_lists_the_core_table_and_the_other_variables_commlib_reads():
    """commlib.config.OTHER_VARIABLES (what init()'s check for misspelt names
    knows besides the core's table) is README's list less the core's."""
    in_readme = readme_names()
    assert in_readme == set(commlib.config.names()) | commlib.config.OTHER_VARIABLES
