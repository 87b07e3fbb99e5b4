"""The docs: CI runs the README's commands word for word, and the pages say what the tree holds."""

import re

from helpers import REPO


def test_ci_runs_the_readme_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    blocks = [block.split("```")[0].strip() for block in readme.split("```bash\n")[1:3]]
    setup, tests = blocks
    assert setup in ci.splitlines()
    assert tests in ci.splitlines()


def test_the_wheel_ships_every_package_of_the_builder():
    """pyproject names its packages: a subpackage left out makes a wheel that cannot import it."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
            "packages"
        ]
    )
    packages = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "builders").rglob("__init__.py")
    }
    assert packages <= listed, f"pyproject.toml does not list {sorted(packages - listed)}"


DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "data" / "README.md",
    REPO / "data" / "ROWS.md",
    REPO / "bench" / "README.md",
]


def _prose(path):
    """The lines of a markdown page outside its fenced code blocks."""
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip("# ").lower())
    return text.replace(" ", "-")


def test_the_readme_is_one_page():
    words = len((REPO / "README.md").read_text(encoding="utf-8").split())
    assert words < 1500, f"README.md has {words} words; move what does not fit into docs/"


def test_no_heading_names_an_issue_number():
    found = [
        f"{path.relative_to(REPO)}: {line}"
        for path in DOCS
        for line in _prose(path)
        if line.startswith("#") and re.search(r"issue\s*\d+|#\d+", line, re.IGNORECASE)
    ]
    assert not found, found


def test_every_relative_link_resolves():
    broken = []
    for path in DOCS:
        for line in _prose(path):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                page = (path.parent / file).resolve() if file else path
                if not page.exists():
                    broken.append(f"{path.relative_to(REPO)}: {target}")
                elif anchor and page.suffix == ".md":
                    anchors = {_anchor(h) for h in _prose(page) if h.startswith("#")}
                    if anchor not in anchors:
                        broken.append(f"{path.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def test_every_path_the_docs_name_exists():
    """A module or script a page names is where it says (outputs and placeholders aside)."""
    missing = sorted(
        {
            f"{path.relative_to(REPO)}: {name}"
            for path in DOCS
            for line in path.read_text(encoding="utf-8").splitlines()
            for name in re.findall(r"\b((?:builders|bench|tests|patches|data)/[\w/.-]*\w)", line)
            if "/." not in name and "NAME" not in name and not (REPO / name).exists()
        }
    )
    assert not missing, missing


def test_the_module_map_lists_every_module():
    """docs/architecture.md names every module under builders/, one row each."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(builders/[\w/]+\.py)` \|", text, re.MULTILINE)
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "builders").rglob("*.py"))
    assert sorted(rows) == modules, (
        f"not in the map: {sorted(set(modules) - set(rows))}; "
        f"in the map, not in the tree: {sorted(set(rows) - set(modules))}; "
        f"listed twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    )


def test_bench_readme_names_every_script():
    text = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    unnamed = [p.name for p in sorted((REPO / "bench").glob("*.py")) if f"`{p.name}`" not in text]
    assert not unnamed, f"bench/README.md does not say what {unnamed} measure"
