"""mkdocs hook (mkdocs.yml ``hooks:``): a docstring's ``results[i][rank]`` is read by markdown as
a reference link ``[i][rank]`` and autorefs warns that no page defines ``rank``. Those warnings
come from Python source, not from a page's links, so they are logged as info; every other warning
(a broken link between pages above all) still fails ``mkdocs build --strict``."""
import logging


class _DocstringBrackets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if ("Could not find cross-reference target" in msg and ".py:" in msg
                and record.levelno == logging.WARNING):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_startup(command, dirty):
    for name in ("mkdocs.plugins.mkdocs_autorefs", "mkdocs.plugins.mkdocs_autorefs.plugin",
                 "mkdocs.plugins.mkdocs_autorefs._internal.plugin"):   # where autorefs logs
        logging.getLogger(name).addFilter(_DocstringBrackets())
