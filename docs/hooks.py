"""mkdocs hook (mkdocs.yml ``hooks:``): a docstring's ``results[i][rank]`` is read by markdown as
a reference link ``[i][rank]`` and autorefs warns that no page defines ``rank``. Those warnings
come from Python source, not from a page's links, so they are logged as info; every other warning
(a broken link between pages above all) still fails ``mkdocs build --strict``.

A markdown page with a formula (``$...$``, which pymdownx.arithmatex wraps in
``<span class="arithmatex">``) gets the vendored MathJax, with the configuration the lessons use
(mkdocs.yml's ``custom_mathjax_url``), linked relative to the page so it works from the file."""
import logging

MATHJAX = "assets/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe,local/grpo_lab"


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


def on_post_page(output: str, page, config) -> str:
    if 'class="arithmatex"' not in output or "mathjax/MathJax.js" in output:
        return output
    up = "../" * page.url.count("/")                  # use_directory_urls: false -> a/b.html
    return output.replace("</body>", f'<script src="{up}{MATHJAX}"></script>\n</body>', 1)
