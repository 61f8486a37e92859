"""A launch profile from a team's shell launch script (``servegate init --from-command``).

The script is read, never run. It converts the straight-line shape the field's launch
scripts have (``../shared/seeds``): variables, ``export``, an ``args=( … )`` array and
one ``exec`` of the server, read top to bottom as bash would (a variable is expanded
with the value it has *at that line*; quoting, escapes and ``#`` comments as bash reads
them). Then:

- every exported variable becomes the profile's ``[env]``, in the script's order;
- the interpreter and ``-m MODULE`` (or an executable) become ``[launch]``; the options
  become ``[args]`` when that renders the very same words, else ``positional`` verbatim;
- a variable holding an absolute path becomes a parameter (``{runtime}``, ``{model}``)
  whose default is the script's value — except the checkout itself (``{release}``) —
  and ``--port N`` becomes ``{port}`` (the config's ``service.port``);
- lines that change nothing the server gets (``cd``, ``git``, ``test``, a pre-flight
  check) are listed with the reason.

It fails closed: anything it does not model — a conditional, a function, ``source``,
``$(…)``, ``${VAR:-x}``, ``$1``, ``~``, a redirection, a pipe, ``;`` or ``&&``, word
splitting of an unquoted variable, ``args+=``, ``unset`` — is refused with its line
number, and the profile is rendered and compared word by word with the script's own
command and environment before it is written: a difference is refused too.

Hand-written: a bash parser (``bashlex``) would still leave every expansion and every
decision above to this module; the subset is small and its edges are refused.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.errors import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: names a profile fills itself: a script parameter of that name is renamed
BUILTIN = {"release", "port", "sha", "short", "host_root"}
#: commands that change nothing the server is started with: listed, not converted
HANDLED = {
    "cd": "servegate starts the service in the release checkout ([launch] cwd)",
    "git": "servegate fetches and checks out the exact SHA itself",
    "test": "servegate checks the checkout (clean, at the SHA) itself",
    "[": "servegate checks the checkout (clean, at the SHA) itself",
    "set": "shell options",
    "echo": "output only",
    "printf": "output only",
    "mkdir": "a directory servegate does not need",
    ":": "does nothing",
    "true": "does nothing",
}
#: commands whose effect on the environment or the command line is not modelled
REFUSED = {
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
    "esac", "function", "source", ".", "unset", "local", "readonly", "declare",
    "typeset", "eval", "shift", "read", "trap", "alias", "return", "exit", "wait",
    "{", "}", "(", ")",
}  # fmt: skip


class Unsupported(ConfigError):
    pass


@dataclass(frozen=True)
class Word:
    """A shell word: what bash makes of it (``literal``) and the profile's form of it."""

    literal: str
    template: str


@dataclass
class Converted:
    """The script as a profile's parts, checked against the script's own words."""

    env: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    interpreter: str = ""
    module: str = ""
    executable: str = ""
    positional: list[str] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)
    port: int | None = None
    #: "line N: text — why" for each line not converted
    skipped: list[str] = field(default_factory=list)
    #: what bash would exec, and with which exported variables (literal values)
    argv: list[str] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    #: the checkout (what ``{release}`` stands for in the check)
    release: str = ""
    #: always empty: a name the script never sets is refused
    unresolved: list[str] = field(default_factory=list)


@dataclass
class _Shell:
    checkout: str
    n: int = 0
    vars: dict[str, Word] = field(default_factory=dict)
    arrays: dict[str, list[Word]] = field(default_factory=dict)
    exported: dict[str, Word] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)

    def refuse(self, what: str, hint: str = "") -> Unsupported:
        return Unsupported(
            f"line {self.n}: {what}",
            hint=hint
            or "servegate init converts straight-line launch scripts (variables, "
            "export, an args=( … ) array, one exec); write that line out plainly, or write "
            "the launch profile by hand (docs/profiles.md)",
        )

    def assign(self, name: str, value: Word) -> None:
        if value.literal.startswith("/") and value.template == value.literal:
            if _same_dir(value.literal, self.checkout):
                slash = "/" if value.literal.endswith("/") and value.literal != "/" else ""
                value = Word(value.literal, "{release}" + slash)
            else:  # a path of this box: a parameter, the script's value its default
                param = base = f"{name}_path" if name in BUILTIN else name
                k = 1
                while self.params.get(param, value.literal) != value.literal:
                    k += 1  # set again to another path: the earlier uses keep theirs
                    param = f"{base}_{k}"
                self.params[param] = value.literal
                value = Word(value.literal, "{" + param + "}")
        self.vars[name] = value
        self.arrays.pop(name, None)
        if name in self.exported:
            self.exported[name] = value

    def ref(self, name: str, quoted: bool) -> Word:
        if name not in self.vars:
            if name in self.arrays:
                raise self.refuse(f'${name} of an array: use "${{{name}[@]}}"')
            raise self.refuse(
                f"${name} is never set in the script",
                hint="set it in the script (name=value or export NAME=value): the box's "
                "service does not have your shell's environment",
            )
        word = self.vars[name]
        if not quoted and re.search(r"\s", word.literal):
            raise self.refuse(f"unquoted ${name} holds spaces (bash would split it)")
        return word


def _same_dir(value: str, checkout: str) -> bool:
    return os.path.realpath(value) == os.path.realpath(checkout)


class _Lexer:
    """Words of one logical line, expanded as bash would (the modelled subset)."""

    def __init__(self, sh: _Shell, text: str) -> None:
        self.sh, self.text, self.i = sh, text, 0

    def words(self, stop_at_paren: bool = False) -> list[Word | tuple[str, str]]:
        """Words; a whole-word ``"${a[@]}"`` is ``("splice", name)``."""
        out: list[Word | tuple[str, str]] = []
        t = self.text
        while self.i < len(t):
            c = t[self.i]
            if c in " \t\n":
                self.i += 1
                continue
            if c == "#":
                nl = t.find("\n", self.i)
                self.i = len(t) if nl < 0 else nl
                continue
            if c == ")" and stop_at_paren:
                self.i += 1
                return out
            splice = re.match(r'"?\$\{(' + NAME.pattern + r')\[@\]\}"?(?=[\s)]|$)', t[self.i :])
            if splice:
                self.i += splice.end()
                out.append(("splice", splice.group(1)))
                continue
            out.append(self.word(stop_at_paren))
        if stop_at_paren:
            raise self.sh.refuse("an array without its closing parenthesis")
        return out

    def word(self, stop_at_paren: bool) -> Word:
        t, lit, tpl = self.text, [], []
        start = self.i
        while self.i < len(t):
            c = t[self.i]
            if c in " \t\n" or (c == ")" and stop_at_paren):
                break
            if c in ";&|<>()`":
                raise self.sh.refuse(
                    f"{c!r} (a command list, redirection, pipe, subshell or command substitution)",
                    hint="the service manager keeps the server's output and runs one command: "
                    "drop redirections and pipes, put exec before the server's command",
                )
            if c == "~" and self.i == start:
                raise self.sh.refuse("~ (write the path out: the service's HOME may differ)")
            if c == "\\":
                lit.append(t[self.i + 1 : self.i + 2])
                tpl.append(t[self.i + 1 : self.i + 2])
                self.i += 2
            elif c == "'":
                end = t.find("'", self.i + 1)
                if end < 0:
                    raise self.sh.refuse("an unterminated ' quote")
                lit.append(t[self.i + 1 : end])
                tpl.append(t[self.i + 1 : end])
                self.i = end + 1
            elif c == '"':
                self.i += 1
                while self.i < len(t) and t[self.i] != '"':
                    d = t[self.i]
                    if d == "\\" and t[self.i + 1 : self.i + 2] in ('"', "\\", "$", "`"):
                        lit.append(t[self.i + 1])
                        tpl.append(t[self.i + 1])
                        self.i += 2
                    elif d == "$":
                        w = self.dollar(quoted=True)
                        lit.append(w.literal)
                        tpl.append(w.template)
                    elif d == "`":
                        raise self.sh.refuse("` (command substitution)")
                    else:
                        lit.append(d)
                        tpl.append(d)
                        self.i += 1
                if self.i >= len(t):
                    raise self.sh.refuse('an unterminated " quote')
                self.i += 1
            elif c == "$":
                w = self.dollar(quoted=False)
                lit.append(w.literal)
                tpl.append(w.template)
            else:
                lit.append(c)
                tpl.append(c)
                self.i += 1
        return Word("".join(lit), "".join(tpl))

    def dollar(self, quoted: bool) -> Word:
        t = self.text
        m = re.match(r"\$\{(" + NAME.pattern + r")\}|\$(" + NAME.pattern + ")", t[self.i :])
        if not m:
            what = t[self.i : self.i + 6]
            raise self.sh.refuse(
                f"{what!r}… (only $NAME and ${{NAME}} are converted: no defaults, "
                "positional parameters, arithmetic or command substitution)"
            )
        self.i += m.end()
        return self.sh.ref(m.group(1) or m.group(2), quoted)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text): continuations joined, an array's ``( … )`` together."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            buf += raw[:-1]
            continue
        buf += raw
        opening = re.match(r"\s*" + NAME.pattern + r"\+?=\(", buf)
        if opening and not _closed(buf[opening.end() :]):
            buf += "\n"
            continue
        out.append((start, buf))
        buf = ""
    if buf.strip():
        out.append((start, buf))
    return out


def _closed(body: str) -> bool:
    """Whether an array's body holds its closing parenthesis outside quotes/comments."""
    i, quote = 0, ""
    while i < len(body):
        c = body[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or body[i - 1] in " \t\n"):
            nl = body.find("\n", i)
            i = len(body) if nl < 0 else nl
            continue
        elif c == ")":
            return True
        i += 1
    return False


def _operator(line: str) -> bool:
    """Whether ``line`` has ``; & | < >`` outside quotes (before a comment)."""
    i, quote = 0, ""
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return False
        elif c in ";&|<>":
            return True
        i += 1
    return False


def _head(line: str) -> str:
    return line.strip().split(None, 1)[0] if line.strip() else ""


def convert(text: str, checkout: Path) -> Converted:
    """The launch of ``text`` (a shell script) as a profile's parts."""
    sh = _Shell(str(checkout))
    result = Converted(release=str(checkout))
    command: list[Word | tuple[str, str]] | None = None
    prefix_env: dict[str, Word] = {}
    candidates: list[tuple[int, str, list[Word | tuple[str, str]], dict[str, Word]]] = []
    for n, line in _logical_lines(text):
        sh.n = n
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if command is not None:
            result.skipped.append(f"line {n}: {stripped[:100]} — after exec: never runs")
            continue
        array = re.match(r"\s*(" + NAME.pattern + r")(\+?)=\(", line)
        if array:
            if array.group(2):
                raise sh.refuse(f"{array.group(1)}+=( … ) (write the whole array once)")
            lexer = _Lexer(sh, line[array.end() :])
            items = lexer.words(stop_at_paren=True)
            if lexer.text[lexer.i :].strip():
                raise sh.refuse("words after an array's closing parenthesis")
            sh.arrays[array.group(1)] = _splice(sh, items)
            sh.vars.pop(array.group(1), None)
            continue
        head = _head(line)
        if head in REFUSED or re.match(NAME.pattern + r"\s*\(\)", stripped):
            raise sh.refuse(f"`{head}`: not a straight-line statement")
        if head in HANDLED:  # read, never expanded: it changes nothing the server gets
            if _operator(line):
                raise sh.refuse(
                    f"`{head}` chained with another command (;, &&, ||, |, &, a redirection)",
                    hint="one command a line: put the server's command on its own exec line",
                )
            result.skipped.append(f"line {n}: {stripped[:100]} — {HANDLED[head]}")
            continue
        words = _Lexer(sh, line).words()
        assigns: dict[str, Word] = {}
        while words and isinstance(words[0], Word) and _assignment(words[0]):
            name, value = _assignment(words[0]) or ("", Word("", ""))
            assigns[name] = value
            words = words[1:]
        if not words:  # NAME=value …: plain assignments
            for name, value in assigns.items():
                sh.assign(name, value)
            continue
        first = words[0]
        cmd = first.literal if isinstance(first, Word) else ""
        if cmd == "export":
            _export(sh, words[1:])
            continue
        if cmd == "exec":
            command, prefix_env = words[1:], assigns
            if command and isinstance(command[0], Word) and command[0].literal.startswith("-"):
                raise sh.refuse(f"exec {command[0].literal} (exec's own options)")
            continue
        if cmd in HANDLED:
            result.skipped.append(f"line {n}: {stripped[:100]} — {HANDLED[cmd]}")
            continue
        candidates.append((n, stripped, words, assigns))
    if command is None:
        if len(candidates) != 1:
            raise ConfigError(
                "the script starts no server: no `exec` line"
                + (f" and {len(candidates)} commands could be it" if candidates else ""),
                hint="end the script with `exec` and the command that starts the server "
                "(e.g. exec python -m vllm.entrypoints.openai.api_server …)",
            )
        n, _, command, prefix_env = candidates.pop()
        result.skipped.append(f"line {n}: no exec: taken as the server's command")
    for n, stripped, _, _ in candidates:
        result.skipped.append(
            f"line {n}: {stripped[:100]} — a command before the server starts: run it in the build"
        )
    argv = _splice(sh, command)
    if not argv:
        raise ConfigError("`exec` without a command")
    env = dict(sh.exported)
    env.update(prefix_env)
    if argv[0].literal == "env":  # exec env A=1 B=2 python …
        argv = argv[1:]
        while argv and _assignment(argv[0]):
            name, value = _assignment(argv[0]) or ("", Word("", ""))
            env[name] = value
            argv = argv[1:]
        if not argv or argv[0].literal.startswith("-"):
            raise ConfigError("`exec env` with options or without a command is not converted")
    argv = _port(result, argv)
    if result.port is not None:
        env = {
            k: Word(v.literal, "{port}") if "PORT" in k and v.literal == str(result.port) else v
            for k, v in env.items()
        }
    result.argv = [w.literal for w in argv]
    result.environ = {k: v.literal for k, v in env.items()}
    result.env = {k: v.template for k, v in env.items()}
    used = " ".join([w.template for w in argv] + list(result.env.values()))
    result.params = {k: v for k, v in sh.params.items() if "{" + k + "}" in used}
    _launch(result, [w.template for w in argv])
    return result


def _assignment(word: Word) -> tuple[str, Word] | None:
    m = re.match(r"(" + NAME.pattern + r")=", word.literal)
    t = re.match(r"(" + NAME.pattern + r")=", word.template)
    if not m or not t or m.group(1) != t.group(1):
        return None
    return m.group(1), Word(word.literal[m.end() :], word.template[t.end() :])


def _splice(sh: _Shell, items: list[Word | tuple[str, str]]) -> list[Word]:
    out: list[Word] = []
    for item in items:
        if isinstance(item, Word):
            out.append(item)
        elif item[1] in sh.arrays:
            out += sh.arrays[item[1]]
        else:
            raise sh.refuse(f"${{{item[1]}[@]}}: no array {item[1]} is set before this line")
    return out


def _export(sh: _Shell, words: list[Word | tuple[str, str]]) -> None:
    for w in words:
        if not isinstance(w, Word) or w.literal.startswith("-"):
            raise sh.refuse("export with options (export -n, -f) is not converted")
        pair = _assignment(w)
        if pair:
            sh.assign(*pair)
            sh.exported[pair[0]] = sh.vars[pair[0]]
        elif NAME.fullmatch(w.literal):
            if w.literal not in sh.vars:
                raise sh.refuse(f"export {w.literal}: it is never set in the script")
            sh.exported[w.literal] = sh.vars[w.literal]
        else:
            raise sh.refuse(f"export {w.literal!r}: not NAME or NAME=value")


def _port(result: Converted, argv: list[Word]) -> list[Word]:
    out = list(argv)
    for i, w in enumerate(out):
        if w.literal == "--port" and i + 1 < len(out) and out[i + 1].literal.isdigit():
            result.port = int(out[i + 1].literal)
            out[i + 1] = Word(out[i + 1].literal, "{port}")
        elif w.literal.startswith("--port=") and w.literal[7:].isdigit():
            result.port = int(w.literal[7:])
            out[i] = Word(w.literal, "--port={port}")
    return out


def _launch(result: Converted, argv: list[str]) -> None:
    if len(argv) >= 3 and argv[1] == "-m":
        result.interpreter, result.module, rest = argv[0], argv[2], argv[3:]
    else:
        result.executable, rest = argv[0], argv[1:]
    result.positional, result.args = _structured(rest) or (rest, {})


def _structured(rest: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    """``[args]`` for a plain ``--key value…`` tail (positional words first); None when the
    tail has anything ``[args]`` would not render back word for word."""
    i, head = 0, []
    while i < len(rest) and not rest[i].startswith("-"):
        head.append(rest[i])
        i += 1
    args: dict[str, Any] = {}
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--") or "=" in tok or len(tok) < 3 or tok[2:] in args:
            return None
        values = []
        i += 1
        while i < len(rest) and not rest[i].startswith("-"):
            values.append(rest[i])
            i += 1
        if not values:
            args[tok[2:]] = True
        elif len(values) == 1:
            args[tok[2:]] = values[0]
        else:
            args[tok[2:]] = values
    return head, args


def _toml_str(value: str) -> str:
    if '"' in value and "'" not in value and "\n" not in value:
        return f"'{value}'"
    return json.dumps(value, ensure_ascii=False)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_str(str(value))


def profile_toml(c: Converted, source: str, engine: str = "vllm") -> str:
    """The profile file's text, checked: rendered with the script's own values it gives the
    script's command and environment word for word (else :class:`ConfigError`)."""
    text = _render(c, source, engine)
    if not _same(c, text):
        flat = Converted(**{**c.__dict__, "positional": _tail(c), "args": {}})
        text = _render(flat, source, engine)
        diff = _same(c, text, explain=True)
        if diff is not True:
            raise ConfigError(
                f"the converted profile would not run what the script runs: {diff}",
                hint="write the launch profile by hand (docs/profiles.md)",
            )
    return text


def _tail(c: Converted) -> list[str]:
    from servegate.engine.profiles import args_to_argv

    return [*c.positional, *args_to_argv(c.args)]


def _render(c: Converted, source: str, engine: str) -> str:
    lines = [
        f"# Converted by `servegate init` from {source}: every exported variable and every",
        "# argument of its command, with its paths as parameters. `servegate render` shows",
        "# the command it makes; edit this file, not the script, from now on.",
    ]
    for note in c.skipped:
        lines.append(f"# not converted: {note}")
    lines += ["[profile]", f"description = {_toml_str('converted from ' + source)}",
              f"engine = {_toml_str(engine)}", ""]  # fmt: skip
    if c.params:
        lines.append("[params]")
        lines += [f"{_toml_key(k)} = {_toml_str(v)}" for k, v in c.params.items()]
        lines.append("")
    lines.append("[launch]")
    if c.module:
        lines += [f"interpreter = {_toml_str(c.interpreter)}", f"module = {_toml_str(c.module)}"]
    else:
        lines.append(f"executable = {_toml_str(c.executable)}")
    if c.positional:
        lines.append(f"positional = {_toml_value(c.positional)}")
    lines += ['cwd = "{release}"', ""]
    if c.env:
        lines.append("[env]")
        lines += [f"{_toml_key(k)} = {_toml_str(v)}" for k, v in c.env.items()]
        lines.append("")
    if c.args:
        lines.append("[args]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in c.args.items()]
        lines.append("")
    return "\n".join(lines)


def _same(c: Converted, text: str, explain: bool = False) -> bool | str:
    """Whether the profile ``text``, rendered with the script's values, gives its words."""
    from servegate.engine import profiles

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "launch.toml"
        path.write_text(text)
        try:
            resolved = profiles.resolve(
                profiles.load(str(path)),
                {},
                {
                    "release": c.release or "/",
                    "port": str(c.port or 8000),
                    "sha": "0" * 40,
                    "short": "0" * 12,
                    "host_root": "/",
                },
            )
        except ConfigError as exc:
            return f"it does not load: {exc}" if explain else False
    argv, env = list(resolved.argv), dict(resolved.env)
    if argv != c.argv:
        first = next((i for i, (a, b) in enumerate(zip(argv, c.argv, strict=False)) if a != b),
                     min(len(argv), len(c.argv)))  # fmt: skip
        return (f"word {first}: {argv[first:first + 1]} instead of {c.argv[first:first + 1]}"
                if explain else False)  # fmt: skip
    if env != c.environ or list(env) != list(c.environ):
        bad = sorted(k for k in set(env) | set(c.environ) if env.get(k) != c.environ.get(k))
        return f"environment {', '.join(bad) or '(order)'} differs" if explain else False
    return True
