"""Diagnostic codes, Q1xx: the recipe as text (reading it, tokens, brackets, units)."""

from __future__ import annotations

from compiler.codes.info import CodeInfo

SYNTAX: tuple[CodeInfo, ...] = (
    CodeInfo("Q100", "the recipe file cannot be read",
             "qrc needs the recipe text before anything else; the path is missing, a folder, or not readable.",
             "qrc check recipes/does-not-exist.recipe"),
    CodeInfo("Q101", "the recipe is not UTF-8 text",
             "Recipes are UTF-8. A byte that is not UTF-8 usually means the path points at a binary file "
             "(a model, an archive) instead of a recipe.",
             "qrc check model.onnx"),
    CodeInfo("Q102", "the recipe is empty",
             "A file with only whitespace or comments describes nothing to compile.",
             "# just a comment"),
    CodeInfo("Q103", "unexpected character",
             "A character that no part of the language uses (a control character, `@`, `;`, a smart quote).",
             'recipe r { model "builtin:tiny-llama"; }'),
    CodeInfo("Q104", "unexpected token",
             "The parser found a word, number or symbol where something else was expected; the message lists "
             "what would have been valid there.",
             "calibrate { chunk }"),
    CodeInfo("Q105", "unclosed `{` or `[`",
             "The file ends while a block or list is still open. The diagnostic points at the bracket that was "
             "never closed, which is usually far from where the file ends.",
             "scheme w4 { weights int4 group 128"),
    CodeInfo("Q106", "missing `->` in a quantize rule",
             "A quantize rule maps selectors to a scheme with `->`; without it qrc cannot tell where the "
             "selectors end.",
             'quantize { "*" w4 }   # write: "*" -> w4'),
    CodeInfo("Q107", "unknown or misplaced keyword",
             "A word that is not a keyword of the language, or a keyword used in a block where it does not "
             "belong (`chunk` outside `calibrate`). The help suggests the closest keyword or the right block.",
             "calibrte { chunk 8 }"),
    CodeInfo("Q108", "size without a valid unit",
             "Memory budgets are sizes with a unit; a bare number is ambiguous (bytes? GiB?). Binary units "
             "(KiB MiB GiB TiB) are powers of 1024, decimal ones (KB MB GB TB) powers of 1000.",
             "memory { ram 4 }   # write: ram 4 GiB"),
    CodeInfo("Q109", "unterminated string",
             "A string must close with `\"` on the same line; otherwise everything after it would be swallowed.",
             'model "builtin:tiny-llama'),
    CodeInfo("Q110", "unmatched `}`",
             "A closing brace with no block open: often a leftover from an edit, or the `{` it should match is "
             "missing.",
             "recipe r { } }"),
    CodeInfo("Q111", "text after the end of the recipe",
             "A recipe file holds exactly one `recipe NAME { … }`; text after its closing brace is not part of it.",
             "recipe r { }\nquantize { }"),
    CodeInfo("Q112", "the recipe file is too large",
             "Recipes are small text files; a file of megabytes is almost certainly the wrong path.",
             "qrc check weights.bin"),
    CodeInfo("Q113", "a number too large to hold",
             "A number beyond the largest float (about 1.8e308) would read as infinity: no bound, size or count "
             "means that, so the recipe or `--set` value is refused where it is written.",
             "verify { metric kld  at_most 1e400 }"),
    CodeInfo("Q114", "a path no file can have",
             "A name longer than the file system takes (255 bytes), a path longer than the system's 4096 bytes or "
             "a NUL byte names no file: the recipe (or `--set`) is refused where the path is written, before "
             "anything is looked up there.",
             'emit "out/<300 characters>"'),
)
