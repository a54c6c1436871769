"""Every file or folder README.md refers to exists in the repository: paths
under the top-level folders (``examples/pytorch_train.py``,
``tests/unit/test_config_table.py``), relative links, any ``*.md`` file it
names, the folders of its Layout tree and the modules it runs with
``python -m``."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT = (REPO / "README.md").read_text()
TOP = ("csrc", "commlib", "frontends", "tests", "examples", "bindings", ".ci")
# A path under a top-level folder; stops at characters no path here contains.
PATH = re.compile(r"(?<![\w./$-])((?:%s)/[\w./*-]*)" % "|".join(re.escape(t) for t in TOP))
MARKDOWN = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]+\.md)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MODULE = re.compile(r"python3?\"?\)?\s+-m\s+(commlib(?:\.\w+)*)")


def exists(ref: str) -> bool:
    ref = ref.rstrip(".,;:")
    if "*" in ref:
        return any(REPO.glob(ref))
    return (REPO / ref).exists()


def test_paths_under_top_level_folders_exist():
    missing = sorted({p for p in PATH.findall(TEXT) if not exists(p)})
    assert not missing, f"README.md names paths that are not in the repository: {missing}"


def test_markdown_files_and_relative_links_exist():
    refs = set(MARKDOWN.findall(TEXT))
    refs |= {link for link in LINK.findall(TEXT) if not re.match(r"[a-z]+:", link)}
    missing = sorted(r for r in refs if r.startswith("..") or not exists(r))
    assert not missing, f"README.md refers to files outside the repository or missing: {missing}"


def test_layout_tree_folders_exist():
    section = TEXT.split("\n## Layout\n", 1)[1]
    tree = section.split("```", 2)[1]
    missing, top = [], None
    for line in tree.splitlines()[1:]:
        match = re.match(r"( *)(\S+)", line)
        if not match or len(match.group(1)) > 2 or "/" not in match.group(2):
            continue  # a description's continuation line, or a name that is not a path
        indent, name = match.groups()
        path = name if not indent else f"{top}/{name}"
        if not indent:
            top = name.rstrip("/")
        if not exists(path):
            missing.append(path)
    assert top, "no Layout tree found in README.md"
    assert not missing, f"README.md's Layout names folders that do not exist: {missing}"


def test_modules_run_with_python_m_exist():
    modules = set(MODULE.findall(TEXT))
    assert modules, "README.md runs no commlib module with python -m"
    missing = []
    for module in sorted(modules):
        base = REPO / Path(*module.split("."))
        if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()
                or (base / "__main__.py").exists()):
            missing.append(module)
    assert not missing, f"README.md runs modules that do not exist: {missing}"
