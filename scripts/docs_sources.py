"""Write the figures of the README and of every docs page into their Markdown sources, from the result files.

    python scripts/docs_sources.py --write   # rewrite the pages whose figures differ from the files
    python scripts/docs_sources.py --check   # exit 1, naming each stale page and the difference

Rendering is ``llmrl.report.docs_tables.render_page`` (the forms a page holds: its module docstring); run ``--write``
after a result file changes. tests/test_docs.py runs the same comparison. A missing file or field exits 2, naming
the page, the file and the key.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from llmrl.files import write_text
from llmrl.report.collect import MissingResultError
from llmrl.report.docs_tables import ResultFieldError, render_page, source_pages

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the stale pages")
    mode.add_argument("--check", action="store_true", help="compare only; exit 1 when a page is stale")
    args = parser.parse_args()
    stale = []
    for page in source_pages(ROOT):
        text = (ROOT / page).read_text()
        try:
            new = render_page(text, ROOT, page=page)
        except (MissingResultError, ResultFieldError, ValueError) as err:  # ValueError: a damaged file too
            print(f"{page}: {err}", file=sys.stderr)
            return 2
        if new == text:
            continue
        stale.append(page)
        if args.write:
            write_text(ROOT / page, new)
        else:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), page,
                                                       f"{page} (from the result files)"))
    if stale:
        print(("rewrote: " if args.write else "stale (run python scripts/docs_sources.py --write): ")
              + ", ".join(stale), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
