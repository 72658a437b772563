"""Untrusted text made harmless for a terminal or a web page.

Spec names, presets, run logs, failure diagnoses and LLM answers are written by someone else.
Printed raw they can
- break Rich: `[/x]` is read as a closing markup tag and raises MarkupError mid-job;
- drive the terminal: ESC sequences (CSI colours, cursor moves, OSC window titles and
  hyperlinks), C1 controls, carriage returns that overwrite the line, bidi overrides that
  reorder what the reader sees (CVE-2021-42574, "Trojan Source");
- flood the screen: a 50 MB name.

`terminal_text` neutralises all of that by showing each such character as a visible escape
(`\\x1b`, `\\u202e`), so what was there stays readable. `markup` additionally escapes Rich
markup for text spliced into a markup string; `rich_text` gives a `rich.text.Text`, which Rich
never parses as markup (prefer it for table cells). `html_escape` is the same for HTML,
`markdown_text` for a Markdown line or table cell.

Redaction of secrets is `optico.redact`'s job and comes first; these helpers only make text
safe to show.
"""

from __future__ import annotations

import html
import re
import unicodedata

from rich.markup import escape as _rich_escape
from rich.text import Text

# Characters that change how text around them reads without showing themselves: bidi marks (LRM,
# RLM, ALM), zero-width space, soft hyphen, word joiner and invisible operators, deprecated format
# controls, BOM, interlinear annotations, tag characters. Zero-width (non-)joiners are not among
# them: they are part of ordinary emoji and scripts (Persian, Indic).
INVISIBLE = "\u00ad\u061c\u180e\u200b\u200e\u200f\u2060-\u2064\u206a-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f"
BIDI = "\u202a-\u202e\u2066-\u2069"  # embeddings, overrides and isolates: they reorder what follows
SEPARATORS = "\u2028\u2029"  # line and paragraph separators: a terminal may treat them as newlines
SURROGATES = "\ud800-\udfff"  # lone ones: undecodable bytes of a file name, which no encoder takes
# Letters that print as nothing (Hangul fillers, the braille blank): a name of them and spaces looks empty.
BLANK_LETTERS = "\u115f\u1160\u2800\u3164\uffa0"
# C0 controls except TAB and LF, DEL, C1 controls, and every kind above: regex character-class bodies
# that the spec's checks and the LLM answers' cleaning build on too.
_UNSAFE = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{BIDI}{SEPARATORS}{SURROGATES}{INVISIBLE}]")
_NEWLINES = re.compile(r"\r\n|\r|\n")


def has_visible(text: str) -> bool:
    """Whether `text` shows anything: a character that is not a space, a blank letter, a mark
    (combining, enclosing, variation selectors) or a format character."""
    return any(not ch.isspace() and ch not in BLANK_LETTERS
               and unicodedata.category(ch) not in ("Mn", "Me", "Cf", "Zs", "Zl", "Zp") for ch in text)


# Long enough for any name, path or diagnosis a person reads; the rest is elided, not wrapped
# over a thousand lines.
DEFAULT_MAX_CHARS = 2000


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clip(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """`text` cut to `max_chars` characters, saying how much was cut."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… [{len(text) - max_chars} more characters]"


def terminal_text(value: object, *, one_line: bool = False, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """`value` as a string that cannot control the terminal: every control, escape and bidi
    character shown as a visible escape. With `one_line`, newlines become `\\n` too.
    Cut to `max_chars` (None: no limit) before escaping, so the limit bounds the work."""
    text = value if isinstance(value, str) else str(value)
    if max_chars is not None:
        text = clip(text, max_chars)
    if one_line:
        text = _NEWLINES.sub("\\\\n", text)
    else:
        text = _NEWLINES.sub("\n", text)  # a bare CR would overwrite the line it is on
    return _UNSAFE.sub(_visible, text.replace("\t", " " if one_line else "\t"))


def markup(value: object, *, one_line: bool = False, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """`terminal_text`, with Rich markup escaped: safe inside a string Rich renders as markup."""
    return _rich_escape(terminal_text(value, one_line=one_line, max_chars=max_chars))


def rich_text(value: object, style: str = "", *, one_line: bool = False,
              max_chars: int | None = DEFAULT_MAX_CHARS) -> Text:
    """A `rich.text.Text` of `terminal_text(value)`: never parsed as markup or emoji codes."""
    return Text(terminal_text(value, one_line=one_line, max_chars=max_chars), style=style)


def html_escape(value: object, *, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """`value` for an HTML page (element text or a quoted attribute): `& < > " '` escaped and
    control/bidi characters shown as visible escapes."""
    return html.escape(terminal_text(value, max_chars=max_chars), quote=True)


def markdown_text(value: object, *, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """`value` in a Markdown line or table cell: one line; control, escape and bidi characters shown as
    visible escapes (a report is read in terminals too); no pipes, no HTML, no links or images. A '>'
    opens no tag: it stays as written ('step 130 s -> 128 s' read '-&gt;' in a terminal), escaped only
    where it would start a quote."""
    flat = terminal_text(" ".join(str(value if value is not None else "").split()), one_line=True,
                         max_chars=max_chars)
    for char in ("\\", "|", "[", "]"):
        flat = flat.replace(char, "\\" + char)
    flat = flat.replace("<", "&lt;").replace("`", "'")
    return "\\" + flat if flat.startswith(">") else flat
