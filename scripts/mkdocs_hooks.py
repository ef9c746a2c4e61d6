"""MkDocs hooks (``hooks:`` in mkdocs.yml).

Some user-guide pages are written separately from the rest of the site (``PENDING``). Until
such a page exists, the nav leaves it out and a link to it is reported at INFO level instead of
failing ``mkdocs build --strict``; once it exists it is in the nav and its links are checked as
any other page's. Every other missing page or anchor still fails the build.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

#: Pages the nav and the guide link to that are written separately (docs_dir-relative).
PENDING = ("guide/cli.md", "guide/testing.md", "guide/settings.md")

#: mkdocs's warning for a link to a missing page; it names the target apart only where it differs
#: from the link as written.
_LINK = re.compile(r"contains a link '([^']+)', but the target (?:'([^']+)' )?is not found among "
                   r"documentation files")


class _PendingPages(logging.Filter):
    """Turns "target not found" warnings about missing ``PENDING`` pages into INFO records."""

    def __init__(self, missing: set[str]):
        super().__init__()
        self.missing = missing

    def filter(self, record: logging.LogRecord) -> bool:
        m = _LINK.search(record.getMessage())
        target = m and (m.group(2) or m.group(1)).split("#")[0]
        if record.levelno == logging.WARNING and target in self.missing:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = f"{record.getMessage()} (a page still to be written)", ()
        return True


def _prune(nav, missing: set[str]):
    """``nav`` without the entries naming a page of ``missing``."""
    if isinstance(nav, list):
        return [p for p in (_prune(item, missing) for item in nav) if p is not None]
    if isinstance(nav, dict):
        pruned = {k: _prune(v, missing) for k, v in nav.items()}
        return {k: v for k, v in pruned.items() if v is not None} or None
    return None if nav in missing else nav


def on_config(config):
    missing = {p for p in PENDING if not (Path(config.docs_dir) / p).is_file()}
    config.nav = _prune(config.nav, missing)
    for name in ("mkdocs.structure.pages", "mkdocs.structure.nav"):
        logger = logging.getLogger(name)
        installed = [f for f in logger.filters if isinstance(f, _PendingPages)]
        if installed:   # mkdocs serve reads the config again: one filter, with the current set
            installed[0].missing = missing
        else:
            logger.addFilter(_PendingPages(missing))
    return config
