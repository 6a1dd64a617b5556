"""lark parse tree → AST (compiler/syntax/ast.py). One method per grammar rule form."""

from __future__ import annotations

from lark import Token, Transformer, v_args

from compiler.source import Source, Span
from compiler.syntax import ast

# `*_opt` rules whose setting key differs from the rule name.
_SETTING_KEYS = {
    "sensitivity_metric_opt": "metric",
    "verify_metric_opt": "metric",
    "vram_devices_opt": "vram",
    "text_field_opt": "text",
    "messages_field_opt": "messages",
    "image_field_opt": "image",
    "rotation_block_opt": "block",
}
_QSPEC_FIELDS = {"dtype": "dtype", "granularity": "granularity", "group_size": "group", "block_shape": "block",
                 "symmetry": "symmetry", "act_mode": "mode"}
_KEYWORD_RULES = {"backend_kind", "policy_kind", "sensitivity_metric",
                  "memory_mode", "verify_metric", "bound_kind", "act_order", "group_scales", "scale_search",
                  "expert_routing", "attention_kernel", "switch", "rows_policy"}


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def block_rule(kind: str):
    """A transformer callback for a `NAME { … }` block rule (calibrate, memory, …)."""
    def build(self, meta, children):
        return ast.Block(kind, tuple(children), self._span(meta))

    return build


def data_rule(kind: str):
    """A transformer callback for a `data KIND …` rule."""
    def build(self, meta, children):
        path = children[0] if children and isinstance(children[0], ast.String) else None
        options = children[-1] if children and isinstance(children[-1], tuple) else ()
        return ast.DataDecl(kind, path, options, self._span(meta))

    return build


@v_args(meta=True)
class AstBuilder(Transformer):
    """Builds AST nodes with spans into `source`."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    # ---- helpers -----------------------------------------------------------------------------
    def _span(self, meta) -> Span:
        return self.source.span(meta.start_pos, meta.end_pos)

    def _tok_span(self, tok: Token) -> Span:
        assert tok.start_pos is not None and tok.end_pos is not None  # the lexer positions every token
        return self.source.span(tok.start_pos, tok.end_pos)

    # ---- tokens (called without meta) --------------------------------------------------------
    @v_args(inline=False, meta=False)
    def NAME(self, tok):
        return ast.Name(str(tok), self._tok_span(tok))

    @v_args(inline=False, meta=False)
    def STRING(self, tok):
        return ast.String(_unescape(tok[1:-1]), self._tok_span(tok))

    @v_args(inline=False, meta=False)
    def REGEX_STRING(self, tok):
        # A regex keeps its backslashes: only `\"` is an escape of the string itself.
        return ast.String(tok[3:-1].replace('\\"', '"'), self._tok_span(tok))

    @v_args(inline=False, meta=False)
    def NUMBER(self, tok):
        return ast.Number(str(tok), float(tok), self._tok_span(tok))

    # ---- generic forms -----------------------------------------------------------------------
    def __default__(self, data, children, meta):
        name = str(data)
        if name in _KEYWORD_RULES:
            tok = children[0]
            return ast.Keyword(name, str(tok), self._tok_span(tok))
        if name.endswith("_opt"):
            return self._setting(name, children, meta)
        if name.endswith("_setting"):  # `--set` entry points
            return children[0]
        return super().__default__(data, children, meta)

    def _setting(self, rule: str, children, meta) -> ast.Setting:
        span = self._span(meta)
        if rule == "bound_opt":
            kind, number = children
            return ast.Setting(kind.value, kind.span, number, span)
        key = _SETTING_KEYS.get(rule, rule[: -len("_opt")])
        key_span = self.source.span(span.start, span.start + len(key))
        if rule in ("passthrough_opt", "choices_opt"):
            value: ast.Value = tuple(c for c in children if c is not None)
        elif rule == "vram_devices_opt":
            value = ast.DeviceSize(children[0], children[1], span)
        else:
            value = children[0]
        return ast.Setting(key, key_span, value, span)

    # ---- recipe ------------------------------------------------------------------------------
    def start(self, meta, children):
        return children[0]

    def recipe(self, meta, children):
        return ast.Recipe(children[0], tuple(children[1:]), self._span(meta))

    def kv_cache_decl(self, meta, children):
        return ast.KvCacheDecl(tuple(children), self._span(meta))

    def transform_decl(self, meta, children):
        name, *body = children
        kind = ast.Keyword("transform_kind", name.value, name.span)
        items = body[0] if body else ()
        settings = tuple(i for i in items if isinstance(i, ast.Setting))
        maps = tuple(i for i in items if isinstance(i, ast.MapDecl))
        return ast.TransformDecl(kind, settings, maps, self._span(meta))

    def transform_body(self, meta, children):
        return tuple(children)

    def duo_scaling_opt(self, meta, children):
        return self._switch("duo_scaling", children, meta)

    def shuffle_opt(self, meta, children):
        return self._switch("shuffle", children, meta)

    def _switch(self, key: str, children, meta) -> ast.Setting:
        """`key` alone means `key on`."""
        span = self._span(meta)
        key_span = self.source.span(span.start, span.start + len(key))
        on = ast.Keyword("switch", "on", key_span)
        return ast.Setting(key, key_span, children[0] if children else on, span)

    def map_decl(self, meta, children):
        selectors = [c for c in children if not isinstance(c, Token)]
        return ast.MapDecl(selectors[0], tuple(selectors[1:]), self._span(meta))

    def model_decl(self, meta, children):
        return ast.ModelDecl(children[0], self._span(meta))

    def backend_decl(self, meta, children):
        return ast.BackendDecl(children[0], self._span(meta))

    # ---- schemes -----------------------------------------------------------------------------
    def scheme_decl(self, meta, children):
        name, *rest = children
        base = rest.pop(0) if rest and isinstance(rest[0], ast.Name) else None
        body = rest[0] if rest else ()
        bare = tuple(c for c in body if isinstance(c, ast.QSpecItem))
        specs = tuple(c for c in body if isinstance(c, ast.QuantSpec))
        items = [k for c in body for k in (c if isinstance(c, tuple) else (c,))]
        rounding = tuple(k for k in items if isinstance(k, ast.Keyword))
        options = next((k for k in items if isinstance(k, ast.RoundingOptions)), None)
        return ast.SchemeDecl(name, base, bare, specs, rounding, self._span(meta), options)

    def scheme_body(self, meta, children):
        return tuple(children)

    def weights_spec(self, meta, children):
        return ast.QuantSpec("weights", tuple(children), False, self._span(meta))

    def activations_spec(self, meta, children):
        return ast.QuantSpec("activations", tuple(children), False, self._span(meta))

    def activations_none(self, meta, children):
        return ast.QuantSpec("activations", (), True, self._span(meta))

    def rounding_spec(self, meta, children):
        # the rounding method's name (a keyword of kind rounding_kind), then its options (`act_order`,
        # `static_groups`, `mse_scales`…) when given
        name, *options = children
        return (ast.Keyword("rounding_kind", name.value, name.span), *options)

    def rounding_options(self, meta, children):
        return ast.RoundingOptions(tuple(children), self._span(meta))

    def _qspec(self, rule, children, meta):
        value = children[0]
        return ast.QSpecItem(_QSPEC_FIELDS[rule], value, self._span(meta))

    def dtype(self, meta, children):
        name = children[0]  # a registered type's name, looked up by elaboration
        return self._qspec("dtype", [ast.Keyword("dtype", name.value, name.span)], meta)

    def granularity(self, meta, children):
        return self._qspec("granularity", [self._keyword("granularity", children)], meta)

    def symmetry(self, meta, children):
        return self._qspec("symmetry", [self._keyword("symmetry", children)], meta)

    def act_mode(self, meta, children):
        return self._qspec("act_mode", [self._keyword("act_mode", children)], meta)

    def group_size(self, meta, children):
        return self._qspec("group_size", children, meta)

    def block_shape(self, meta, children):
        return self._qspec("block_shape", [self._keyword("block_shape", children)], meta)

    def _keyword(self, kind, children) -> ast.Keyword:
        tok = children[0]
        return ast.Keyword(kind, str(tok), self._tok_span(tok))

    # ---- rules and groups --------------------------------------------------------------------
    def quantize_block(self, meta, children):
        return ast.QuantizeBlock(tuple(children), self._span(meta))

    def quantize_rule(self, meta, children):
        selectors = tuple(c for c in children if isinstance(c, ast.Selector))
        return ast.QuantizeRule(selectors, children[-1], self._span(meta))

    def glob_selector(self, meta, children):
        return ast.Selector("glob", children[0].value, self._span(meta))

    def regex_selector(self, meta, children):
        return ast.Selector("regex", children[0].value, self._span(meta))

    def type_selector(self, meta, children):
        return ast.Selector("type", children[0].value, self._span(meta))

    def scheme_ref(self, meta, children):
        return children[0]

    def group_decl(self, meta, children):
        policy = children[1] if len(children) > 1 else None
        return ast.GroupDecl(children[0], policy, self._span(meta))

    def group_auto_qkv(self, meta, children):
        return ast.GroupDecl(None, children[0] if children else None, self._span(meta), "qkv")

    def group_auto_gate_up(self, meta, children):
        return ast.GroupDecl(None, children[0] if children else None, self._span(meta), "gate_up")

    def group_auto_all(self, meta, children):
        return ast.GroupDecl(None, children[0] if children else None, self._span(meta), "all")

    def group_policy(self, meta, children):
        return children[0]

    # ---- blocks ------------------------------------------------------------------------------
    calibrate_block = block_rule("calibrate")
    mixed_precision_block = block_rule("mixed_precision")
    memory_block = block_rule("memory")
    verify_block = block_rule("verify")

    synthetic_data = data_rule("synthetic")
    npz_data = data_rule("npz")
    text_data = data_rule("text")
    dataset_data = data_rule("dataset")

    def data_options(self, meta, children):
        return tuple(children)

    def method_decl(self, meta, children):
        name = children[0]
        number = children[1] if len(children) > 1 and isinstance(children[1], ast.Number) else None
        options = children[-1] if isinstance(children[-1], tuple) else ()
        return ast.MethodDecl(ast.Keyword("method", name.value, name.span), number, options, self._span(meta))

    def method_options(self, meta, children):
        return tuple(children)

    def method_opt(self, meta, children):
        key, value = children
        return ast.Setting(key.value, key.span, value, self._span(meta))

    def number_list(self, meta, children):
        return tuple(children)

    def size(self, meta, children):
        return ast.Size(children[0], children[1], self._span(meta))

    def emit_decl(self, meta, children):
        options = children[1] if len(children) > 1 else ()
        return ast.EmitDecl(children[0], options, self._span(meta))

    def emit_options(self, meta, children):
        return tuple(children)
