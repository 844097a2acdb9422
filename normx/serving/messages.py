"""What a server tells a visitor when a request fails: the error's message in the page's words, quoting at most a
short excerpt of what was sent (a 5 MB request never comes back as a 5 MB message), and in locked mode nothing of
the server's files (a failure that is not the visitor's is one generic sentence, its details in the server's log).
Plain functions; the demo's handlers call :func:`error_message` (tests call it directly).
"""

from __future__ import annotations

import re
import reprlib

from normx.errors import NormxError

EXCERPT = 40  # characters of a given value a message quotes
MAX_MESSAGE = 320  # characters of a message shown: its start and its end (what is allowed) when longer
LONG_WORD = 80  # a run of characters without white space longer than this is an input, not a word: shortened
SERVER_FAILURE = "this request failed on the server (the details are in its log); try another input or method"
# what the library says in its own arguments -> what the page calls them
_API_WORDS = (("with text_pair= (CLI: --pair)", "in the Second text box"),
              ("pass truncation='warn' to truncate it", "it is cut to the limit when over it"))


def excerpt(value, limit: int = EXCERPT) -> str:
    """``value`` quoted for a message: its ``repr`` when short, else the ``repr`` of its start and how long it is
    (``'aaaa…' (5,000,000 characters)``; a long list's first items, abbreviated, and its length), never reading more
    of it than it shows."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value):,} characters)"
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit // 2 if isinstance(value, (list, tuple, dict, set)) else limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 2
    shown = short.repr(value)
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 2:
        shown += f" ({len(value):,} items)"
    return shown


def shorten(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` with every run of more than :data:`LONG_WORD` non-space characters cut to an excerpt, and at most
    ``limit`` characters: its start and its end (which says what is allowed) around an ellipsis."""
    message = re.sub(rf"\S{{{LONG_WORD + 1},}}", lambda m: f"{m.group()[:EXCERPT]}… ({len(m.group()):,} characters)",
                     message)
    if len(message) <= limit:
        return message
    tail = limit // 3
    return f"{message[:limit - tail - 3]} … {message[-tail:]}"


def page_message(message: str) -> str:
    """An error message in the page's words (the library names its own arguments)."""
    for api, page in _API_WORDS:
        message = message.replace(api, page)
    return message


def error_message(exc: BaseException, locked: bool = False) -> str:
    """What the page says for ``exc``: a normx error's own message (what was given, what is allowed) in the page's
    words, shortened (:func:`shorten`); any other failure as its type and message when unlocked (the person serving
    is the visitor), as :data:`SERVER_FAILURE` in locked mode (a Space: a stranger learns nothing of the server)."""
    if isinstance(exc, NormxError):
        return shorten(page_message(str(exc) or type(exc).__name__))
    if locked:
        return SERVER_FAILURE
    return shorten(f"{type(exc).__name__}: {exc}")
