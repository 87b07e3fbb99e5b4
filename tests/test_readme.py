"""CI runs the README's commands, word for word."""

from helpers import REPO


def test_ci_runs_the_readme_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    blocks = [block.split("```")[0].strip() for block in readme.split("```bash\n")[1:3]]
    setup, tests = blocks
    assert setup in ci.splitlines()
    assert tests in ci.splitlines()
