"""The house's shape: imports between fastload's modules only go one way.

A cycle makes import order matter (a name missing from a half-imported
module) and hides which module is built on which.  Imports inside functions
are left out: they are the deliberate way to reach an optional module (torch)
late.
"""

import ast
import os
import re

from paths import REPO_DIR

PACKAGE_DIR = os.path.join(REPO_DIR, "fastload")


def _module_name(path: str) -> str:
    relative = os.path.relpath(path, REPO_DIR)[:-len(".py")].split(os.sep)
    if relative[-1] == "__init__":
        relative.pop()
    return ".".join(relative)


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[_module_name(path)] = path
    return found


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level_imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The fastload modules ``name`` imports as it is imported (not inside functions)."""
    with open(path) as source:
        tree = ast.parse(source.read())
    is_package = path.endswith("__init__.py")
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, is_package, node)
            for alias in node.names:
                # ``from fastload.x import y``: y may be a module of its own.
                child = f"{target}.{alias.name}"
                imported.add(child if child in modules else target)
    return {target for target in imported if target in modules and target != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_finder_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    assert "fastload.dataloader" in modules and "fastload.collate" in modules
    # The package's own __init__ re-exports the public names: every module
    # reaches it implicitly, so it is the root and no edge points back at it.
    graph = {name: _top_level_imports(name, path, modules) - {"fastload"}
             for name, path in modules.items()}
    assert sum(len(targets) for targets in graph.values()) > len(graph)  # it saw the imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


# A NOTE is defined on a line of its own (in a docstring or a comment);
# elsewhere it is mentioned, often with the file it is in.  A mention may
# wrap over lines, inside a comment.
_NOTE = re.compile(r"NOTE \[ (.+?) \](?:[\s)]*in\s+[`]*([\w/.]+))?", re.DOTALL)
_DEFINITION = re.compile(r"^[ \t]*(?:#[ \t]*)?NOTE \[ ([^\]\n]+) \][ \t]*$", re.MULTILINE)


def _title(text: str) -> str:
    return " ".join(re.sub(r"\n\s*#?", " ", text).split())


def _text_files() -> list[str]:
    found = []
    for top in ("fastload", "docs", "bench", "tests", "examples"):
        for folder, _, files in os.walk(os.path.join(REPO_DIR, top)):
            found += [os.path.join(folder, name) for name in files
                      if name.endswith((".py", ".pyx", ".pxi", ".pyi", ".md"))]
    return found + [os.path.join(REPO_DIR, "README.md")]


def _is_in(home: str, where: str) -> bool:
    """Whether file ``home`` is the ``where`` a mention names: a path's tail,
    with or without ".py", or a folder holding it."""
    where = where.rstrip("/")
    return (home.endswith(where) or home.removesuffix(".py").endswith(where)
            or f"{where}/" in home)


def test_every_note_mentioned_exists_where_the_mention_says():
    texts = {}
    for path in _text_files():
        if os.path.samefile(path, __file__):
            continue
        with open(path) as handle:
            texts[os.path.relpath(path, REPO_DIR)] = handle.read()
    defined = {}
    for path, text in texts.items():
        for title in _DEFINITION.findall(text):
            defined.setdefault(_title(title), []).append(path)
    assert len(defined) > 10  # it found the NOTEs
    wrong = []
    for path, text in texts.items():
        for title, where in _NOTE.findall(text):
            title, where = _title(title), where.rstrip(".,;:")
            homes = defined.get(title)
            if not homes:
                wrong.append(f"{path}: NOTE [ {title} ] is defined nowhere")
            elif where and not any(_is_in(home, where) for home in homes):
                wrong.append(f"{path}: NOTE [ {title} ] is in {homes}, not in {where}")
    assert not wrong, "\n".join(wrong)


def _readme_layout() -> dict[str, str]:
    """The README's layout block, by section: a line naming a top-level
    ``fastload/`` file or folder, with the indented lines under it."""
    with open(os.path.join(REPO_DIR, "README.md")) as handle:
        readme = handle.read()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    sections: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("fastload/"):
            current = line.split()[0]
            sections[current] = line
        elif line.startswith(" ") and current:
            sections[current] += "\n" + line
        else:
            current = None
    return sections


def test_the_readme_layout_names_every_source_file():
    sections = _readme_layout()
    assert "fastload/dataloader.py" in sections
    missing = []
    for path in sorted(_modules().values()) + sorted(
            os.path.join(folder, name) for folder, _, names in os.walk(PACKAGE_DIR)
            for name in names if name.endswith((".pyx", ".pxi", ".pyi"))):
        relative = os.path.relpath(path, PACKAGE_DIR).split(os.sep)
        if len(relative) == 1:
            # A root file: its own line, or named on a neighbour's (__main__.py, _core.pyi).
            found = any(re.search(rf"(^|\s|/){re.escape(relative[0])}\b", text)
                        for text in sections.values())
        elif relative[-1] == "__init__.py":
            found = f"fastload/{'/'.join(relative[:-1])}/" in sections or any(
                f"{'/'.join(relative[1:-1])}/" in text for text in sections.values())
        else:
            home = sections.get(f"fastload/{relative[0]}/", "") + sections.get(
                "fastload/_core.pyx", "")
            found = re.search(rf"(^|\s){re.escape('/'.join(relative[1:]))}\b", home) or \
                re.search(rf"(^|\s){re.escape('/'.join(relative))}\b", home)
        if not found:
            missing.append(os.path.relpath(path, REPO_DIR))
    assert not missing, f"README's layout does not name: {missing}"
