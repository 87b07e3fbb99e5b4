"""CI runs the README's commands, word for word."""

from helpers import REPO


def test_ci_runs_the_readme_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    blocks = [block.split("```")[0].strip() for block in readme.split("```bash\n")[1:3]]
    setup, tests = blocks
    assert setup in ci.splitlines()
    assert tests in ci.splitlines()


def test_the_wheel_ships_every_package_of_the_builder():
    """pyproject lists its packages by name: a new subpackage left out builds a wheel that cannot import it."""
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
