"""Rewrite the README's results table from metrics/ (the block between its two marker comments).

    python scripts/readme_results.py           # rewrite README.md
    python scripts/readme_results.py --check   # exit 1, naming the difference, when README.md disagrees

The table is ``llmrl.report.docs_tables.readme_block``: the headline table of the docs site in plain Markdown.
tests/test_docs.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from llmrl.files import write_text
from llmrl.report.docs_tables import readme_block, replace_readme_block

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when README.md disagrees")
    args = parser.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = replace_readme_block(text, readme_block(ROOT))
    if args.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "README.md",
                                                       "README.md (from metrics/)"))
            return 1
        return 0
    if new != text:
        write_text(readme, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
