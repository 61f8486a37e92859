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

It fails closed, by allowlist: a word may hold letters, digits and ``_-./:=,+@%^#``
unquoted, quotes, escapes and ``$NAME``/``${NAME}`` (an unquoted one only when its value
is one plain word); a statement may be an assignment, ``export``, an array, ``set`` with
harmless flags, ``exec``, a command by its path (a pre-flight program: listed), or a
command that changes nothing (``cd``, ``git``, ``test``, ``echo``, ``mkdir``, ``:``),
read but never expanded, refused where it could change a variable (``$((…))``,
``${A:=…}``). Everything else — globs, braces, ``~``, ``$(…)``, ``${VAR:-x}``, ``$1``,
redirections, pipes, lists, conditionals, functions, builtins (``source``, ``let``,
``printf -v``, ``declare``…), ``IFS``, CR line ends, control characters — is refused with
its line. Then the profile is rendered and compared word by word with the script's own
command and environment before it is written: a difference is refused too.

Hand-written: a bash parser (``bashlex``) would still leave every expansion and every
decision above to this module; the subset is small and its edges are refused.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

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
    "echo": "output only",
    "mkdir": "a directory servegate does not need",
    ":": "does nothing",
    "true": "does nothing",
}


class Unsupported(ConfigError):
    pass


@dataclass(frozen=True)
class Word:
    """A shell word: what bash makes of it (``literal``) and the profile's form of it.
    ``assign``: the name of an unquoted ``NAME=`` prefix (an assignment word);
    ``splice``: a whole-word ``"${NAME[@]}"``; ``items``: an array's words."""

    literal: str
    template: str
    assign: str = ""
    splice: str = ""
    items: tuple[Word, ...] | None = None


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
    #: always empty: a name the script never sets is refused with its line
    unresolved: list[str] = field(default_factory=list)


#: shell variables bash reads, sets or computes itself: an assignment to one is refused
SPECIAL = {
    "IFS", "GLOBIGNORE", "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT", "BASH_ENV", "ENV",
    "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "_", "LINENO", "RANDOM", "SRANDOM",
    "SECONDS", "EPOCHSECONDS", "EPOCHREALTIME", "BASHPID", "UID", "EUID", "PPID", "GROUPS",
    "FUNCNAME", "HISTCMD", "OPTIND", "OPTARG", "OPTERR", "SHLVL", "PWD", "OLDPWD",
    "PIPESTATUS", "REPLY", "COLUMNS", "LINES", "HOSTNAME", "HOSTTYPE", "MACHTYPE", "OSTYPE",
    "CDPATH", "TMOUT", "MAIL", "MAILPATH", "MAILCHECK",
}  # fmt: skip
#: characters a word may hold unquoted: no globs, braces, tildes, operators
PLAIN = re.compile(r"[A-Za-z0-9_\-./:=,+@%^#\x80-\U0010ffff]")
#: `set` flags that change nothing the server gets (not -x: PS4 runs code at each trace)
SET_FLAGS = re.compile(r"^[-+][euo]+$|^(pipefail|errexit|nounset)$")


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
        if name in SPECIAL or name.startswith("BASH"):
            raise self.refuse(f"{name}= changes how bash reads the script")
        if value.literal.startswith("/") and value.template == value.literal:
            if _same_dir(value.literal, self.checkout):
                slash = "/" if value.literal.endswith("/") and value.literal != "/" else ""
                value = Word(value.literal, "{release}" + slash)
            else:  # a path of this box: a parameter, the script's value its default
                value = Word(value.literal, "{" + self.param(name, value.literal) + "}")
        self.vars[name] = Word(value.literal, value.template)
        self.arrays.pop(name, None)
        if name in self.exported:
            self.exported[name] = self.vars[name]

    def param(self, name: str, path: str) -> str:
        """The parameter a path of this box becomes, named ``name`` (``NAME_2``… when
        that name already holds another path: the earlier uses keep theirs)."""
        param = base = f"{name}_path" if name in BUILTIN else name
        k = 1
        while self.params.get(param, path) != path:
            k += 1
            param = f"{base}_{k}"
        self.params[param] = path
        return param

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
        if not quoted and (not word.literal or re.search(r"[\s*?\[]", word.literal)):
            raise self.refuse(
                f"unquoted ${name} is empty or holds spaces or glob characters (bash would "
                f'split, drop or expand it): quote it, "${name}"'
            )
        return word


def _same_dir(value: str, checkout: str) -> bool:
    return os.path.realpath(value) == os.path.realpath(checkout)


class _Stream:
    """The script as simple commands, read as bash reads them (the modelled subset)."""

    def __init__(self, sh: _Shell, text: str) -> None:
        self.sh, self.t, self.i, self.line = sh, text, 0, 1

    def commands(self) -> Iterator[tuple[int, str, list[Word]]]:
        """(first line, raw text, words) of each command; ``lenient`` commands (those that
        change nothing: cd, git, test…) are read, never expanded."""
        t = self.t
        while True:
            words: list[Word] = []
            first, begin = self.line, self.i
            lenient = False
            while self.i < len(t):
                c = t[self.i]
                if c in " \t":
                    self.i += 1
                elif c == "\\" and t[self.i + 1 : self.i + 2] == "\n":
                    self.i += 2
                    self.line += 1
                elif c == "#":
                    self._comment()
                elif c == "\n":
                    self.i += 1
                    self.line += 1
                    if words or lenient:
                        break
                    first, begin = self.line, self.i
                elif lenient:
                    self._skip_word()
                else:
                    self.sh.n = self.line
                    if not words and re.match(_HANDLED_RE, t[self.i :]):
                        lenient = True
                        continue
                    words.append(self._word(array_ok=not words))
            else:
                if not words and not lenient:
                    return
            self.sh.n = first
            raw = " ".join(t[begin : self.i].replace("\\\n", " ").split())
            yield first, raw, ([] if lenient else words)
            if self.i >= len(t):
                return

    def _comment(self) -> None:
        nl = self.t.find("\n", self.i)
        self.i = len(self.t) if nl < 0 else nl

    def _skip_word(self) -> None:
        """One word of a command that is read, not run here (cd, git, test…). What it could
        do to the shell's own state, or to how the next lines are read, is refused: a
        chain or redirection, arithmetic, ``${NAME<op>…}``, indirection, ``test -v``, a
        newline inside quotes, a substitution that does not close on its line."""
        t = self.t
        if re.match(r"-v(?=[ \t\n]|$)", t[self.i :]):
            raise self.sh.refuse("test -v: it can evaluate an array subscript")
        quote = ""
        while self.i < len(t):
            c = t[self.i]
            if c == "\n" and quote:
                raise self.sh.refuse("a newline inside quotes in a command servegate skips")
            if quote == "'":
                quote = "" if c == "'" else quote
                self.i += 1
                continue
            if not quote and c in " \t\n":
                return
            if c == '"' or (c == "'" and not quote):
                quote = "" if quote else c
                self.i += 1
            elif c == "\\":
                if t[self.i + 1 : self.i + 2] in ("\n", ""):
                    raise self.sh.refuse("a line continuation in a command servegate skips")
                self.i += 2
            elif not quote and c in ";&|<>()":
                raise self.sh.refuse(
                    "a command chained with another (;, &&, ||, |, &, a redirection)",
                    hint="one command a line: put the server's command on its own exec line",
                )
            elif c == "`":
                self._substitution("`")
            elif c == "$" and t.startswith("$(", self.i) and not t.startswith("$((", self.i):
                self._substitution(")")
            elif c == "$" and not re.match(
                r"\$(\{" + NAME.pattern + r"\}|" + NAME.pattern + r"|[0-9?#*@$-]|(?=[\s\"]|$))",
                t[self.i :],
            ):
                raise self.sh.refuse(
                    f"{t[self.i : self.i + 6]!r}… in a command servegate skips: arithmetic, "
                    "${NAME<op>…}, $'…' or indirection could change a variable"
                )
            else:
                self.i += 1
        if quote:
            raise self.sh.refuse(f"an unterminated {quote} quote")

    def _substitution(self, close: str) -> None:
        """Skip ``$( … )`` or a backtick pair of a skipped command: a subshell, which changes
        nothing here — but only on one line, so it cannot hide lines from this reader."""
        t = self.t
        self.i += 2 if close == ")" else 1
        depth, quote = 1, ""
        while self.i < len(t) and t[self.i] != "\n":
            c = t[self.i]
            if quote:
                if c == "\\" and quote == '"':
                    self.i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "\\":
                self.i += 1
            elif c == "`" and close == ")":
                raise self.sh.refuse("a backtick inside $( … ) of a command servegate skips")
            elif close == ")" and c == "(":
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1
        raise self.sh.refuse("a command substitution that does not close on its line")

    def _word(self, array_ok: bool) -> Word:
        t, start = self.t, self.i
        assign = re.match(NAME.pattern + r"=", t[self.i :])
        if assign and array_ok and t[self.i + assign.end() : self.i + assign.end() + 1] == "(":
            self.i += assign.end() + 1
            return Word("", "", assign.group(0)[:-1], items=tuple(self._array()))
        splice = re.match(r'"\$\{(' + NAME.pattern + r')\[@\]\}"(?=[\s)]|$)', t[self.i :])
        if splice:
            self.i += splice.end()
            return Word("", "", splice=splice.group(1))
        lit: list[str] = []
        tpl: list[str] = []
        if assign:
            lit.append(assign.group(0))
            tpl.append(assign.group(0))
            self.i += assign.end()
        while self.i < len(t):
            c = t[self.i]
            if c in " \t\n" or c == ")":
                break
            if c == "\\":
                nxt = t[self.i + 1 : self.i + 2]
                if nxt == "\n":
                    raise self.sh.refuse("a line continuation inside a word")
                if not nxt:
                    raise self.sh.refuse("a backslash at the end of the script")
                lit.append(nxt)
                tpl.append(nxt)
                self.i += 2
            elif c == "'":
                end = t.find("'", self.i + 1)
                if end < 0:
                    raise self.sh.refuse("an unterminated ' quote")
                self._plain_quoted(t[self.i + 1 : end])
                lit.append(t[self.i + 1 : end])
                tpl.append(t[self.i + 1 : end])
                self.i = end + 1
            elif c == '"':
                self._double(lit, tpl)
            elif c == "$":
                w = self._dollar(quoted=False)
                lit.append(w.literal)
                tpl.append(w.template)
            elif PLAIN.match(c):
                lit.append(c)
                tpl.append(c)
                self.i += 1
            else:
                raise self.sh.refuse(
                    f"unquoted {c!r} (a glob, brace, tilde, redirection, pipe, list or "
                    "subshell: bash would expand or run it): quote it or write it out"
                )
        if self.i == start:
            raise self.sh.refuse(f"unexpected {t[self.i]!r}")
        return Word("".join(lit), "".join(tpl), assign.group(0)[:-1] if assign else "")

    def _plain_quoted(self, text: str) -> None:
        if "\n" in text or re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text):
            raise self.sh.refuse("a newline or control character inside quotes")

    def _double(self, lit: list[str], tpl: list[str]) -> None:
        t = self.t
        self.i += 1
        while self.i < len(t) and t[self.i] != '"':
            d = t[self.i]
            if d == "\\" and t[self.i + 1 : self.i + 2] in ('"', "\\", "$", "`"):
                lit.append(t[self.i + 1])
                tpl.append(t[self.i + 1])
                self.i += 2
            elif d == "\\" and t[self.i + 1 : self.i + 2] == "\n":
                raise self.sh.refuse("a line continuation inside quotes")
            elif d == "$":
                w = self._dollar(quoted=True)
                lit.append(w.literal)
                tpl.append(w.template)
            elif d == "`":
                raise self.sh.refuse("` (command substitution)")
            else:
                self._plain_quoted(d)
                lit.append(d)
                tpl.append(d)
                self.i += 1
        if self.i >= len(t):
            raise self.sh.refuse('an unterminated " quote')
        self.i += 1

    def _dollar(self, quoted: bool) -> Word:
        t = self.t
        m = re.match(r"\$\{(" + NAME.pattern + r")\}|\$(" + NAME.pattern + ")", t[self.i :])
        if not m:
            raise self.sh.refuse(
                f"{t[self.i : self.i + 6]!r}… (only $NAME and ${{NAME}} are converted: no "
                "defaults, positional parameters, arithmetic or command substitution)"
            )
        self.i += m.end()
        return self.sh.ref(m.group(1) or m.group(2), quoted)

    def _array(self) -> list[Word]:
        t = self.t
        items: list[Word] = []
        while self.i < len(t):
            c = t[self.i]
            if c in " \t":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "\\" and t[self.i + 1 : self.i + 2] == "\n":
                self.i += 2
                self.line += 1
            elif c == "#":
                self._comment()
            elif c == ")":
                self.i += 1
                return items
            else:
                word = self._word(array_ok=False)
                if word.assign:  # NAME=x inside ( … ): a plain word there
                    word = Word(word.literal, word.template)
                items.append(word)
        raise self.sh.refuse("an array without its closing parenthesis")


#: a command that changes nothing the server gets: read, listed, never run or expanded
_HANDLED_RE = r"(cd|git|test|\[|echo|mkdir|:|true)(?=[ \t\n]|$)"


def _check_text(sh: _Shell, text: str) -> None:
    """Line ends and characters bash and this reader could read differently."""
    for n, line in enumerate(text.split("\n"), 1):
        sh.n = n
        if "\r" in line:
            raise sh.refuse("a CR line ending (convert the file: dos2unix)")
        if re.search(r"[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029\ud800-\udfff]", line):
            raise sh.refuse("a control character or an invalid character")


def convert(text: str, checkout: Path) -> Converted:
    """The launch of ``text`` (a shell script) as a profile's parts."""
    sh = _Shell(str(checkout))
    _check_text(sh, text)
    result = Converted(release=str(checkout))
    command: list[Word] | None = None
    prefix_env: dict[str, Word] = {}
    candidates: list[tuple[int, str, list[Word], dict[str, Word]]] = []
    #: ``source VENV/bin/activate``: the bin/ a bare interpreter name is taken from
    activated: Word | None = None
    #: the last ``cd``: (line, its directory; "" where it cannot be read)
    cd: tuple[int, str] | None = None
    for n, raw, words in _Stream(sh, text).commands():
        if command is not None:
            result.skipped.append(f"line {n}: {raw[:100]} — after exec: never runs")
            continue
        if not words:  # a command that changes nothing the server gets
            head = raw.split(None, 1)[0]
            result.skipped.append(f"line {n}: {raw[:100]} — {HANDLED[head]}")
            if head == "cd":
                cd = (n, _cd_target(raw))
            continue
        assigns: dict[str, Word] = {}
        while words and words[0].assign:
            w = words.pop(0)
            if w.items is not None:
                if words or assigns:
                    raise sh.refuse("an array assignment with other words")
                if w.assign in sh.exported:
                    raise sh.refuse(f"{w.assign}=( … ) on an exported variable")
                sh.arrays[w.assign] = _splice(sh, list(w.items))
                sh.vars.pop(w.assign, None)
                break
            assigns[w.assign] = _value(w)
        if not words:  # NAME=value …: plain assignments
            for name, value in assigns.items():
                sh.assign(name, value)
            continue
        cmd = words[0].literal if not words[0].splice else ""
        if cmd == "export" and not assigns:
            _export(sh, words[1:])
            continue
        if cmd == "set" and not assigns and all(SET_FLAGS.match(w.literal) for w in words[1:]):
            result.skipped.append(f"line {n}: {raw[:100]} — shell options")
            continue
        if cmd == "exec":
            command, prefix_env = words[1:], assigns
            if not command or command[0].literal.startswith("-"):
                raise sh.refuse("exec without a command, or with exec's own options")
            continue
        if (
            cmd in ("source", ".")
            and not assigns
            and len(words) == 2
            and (words[1].literal.endswith("/bin/activate") and not words[1].splice)
        ):
            cut = len("activate")
            activated = Word(words[1].literal[:-cut], words[1].template[:-cut])
            result.skipped.append(
                f"line {n}: {raw[:100]} — a virtualenv: the server's interpreter is taken from "
                f"{activated.literal}"
            )
            continue
        if cmd in ("source", "."):
            raise sh.refuse(
                f"`{cmd} {words[1].literal if len(words) > 1 else ''}`: servegate init cannot "
                "tell what a sourced file sets",
                hint="write the variables it sets as `export NAME=value` lines in the script "
                "(they become the profile's [env]); a virtualenv's `source VENV/bin/activate` "
                "is understood: init takes the interpreter from VENV/bin/",
            )
        if cmd == "conda" and len(words) >= 2 and words[1].literal == "activate":
            env_name = words[2].literal if len(words) > 2 else "base"
            raise sh.refuse(
                f"`conda activate {env_name}`: which interpreter that is depends on conda's "
                "own setup, which init does not read",
                hint="name the environment's interpreter by its path in the exec line — e.g. "
                f"exec /opt/conda/envs/{env_name}/bin/python -m vllm.entrypoints.openai."
                f"api_server … (`conda run -n {env_name} which python` prints it) — and drop "
                "the activate line",
            )
        if "/" not in cmd:
            raise sh.refuse(
                f"`{cmd}`: not a command servegate init can tell is harmless (a builtin or a "
                "function could change what the server gets)",
                hint="give a pre-flight program by its path (it then runs in the build, not "
                "here), or leave it out of the launch script",
            )
        candidates.append((n, raw, words, assigns))
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
    for n, raw, _, _ in candidates:
        result.skipped.append(
            f"line {n}: {raw[:100]} — a command before the server starts: run it in the build"
        )
    argv = _splice(sh, command)
    if not argv or argv[0].literal.startswith("-"):
        raise ConfigError("exec without a command, or with exec's own options (after expansion)")
    if activated is not None and "/" not in argv[0].literal and argv[0].literal != "env":
        argv[0] = Word(activated.literal + argv[0].literal, activated.template + argv[0].template)
    if cd is not None:
        _relative_after_cd(sh, cd, checkout, [*([activated] if activated else []), *argv])
    env = dict(sh.exported)
    env.update(prefix_env)
    if argv[0].literal == "env":  # exec env A=1 B=2 python …
        argv = argv[1:]
        while argv and "=" in argv[0].literal and not argv[0].literal.startswith("-"):
            key, _, raw = argv[0].literal.partition("=")
            if not NAME.fullmatch(key) or not argv[0].template.startswith(key + "="):
                raise sh.refuse(f"env {argv[0].literal!r}: not NAME=value")
            env[key] = Word(raw, argv[0].template[len(key) + 1 :])
            argv = argv[1:]
        if not argv or argv[0].literal.startswith("-"):
            raise ConfigError("`exec env` with options or without a command is not converted")
    argv = _port(result, argv)
    argv = argv[:1] + [_path_word(sh, argv[i - 1], w) for i, w in enumerate(argv[1:], 1)]
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


def _cd_target(raw: str) -> str:
    """The directory of a ``cd`` line as written ("" where it is not one plain word)."""
    try:
        parts = shlex.split(raw, comments=True)
    except ValueError:
        return ""
    if len(parts) != 2 or "$" in parts[1] or parts[1].startswith("~"):
        return "" if len(parts) > 1 else os.path.expanduser("~")
    return parts[1]


def _relative_after_cd(sh: _Shell, cd: tuple[int, str], checkout: Path, words: list[Word]) -> None:
    """Refuse a relative path the script resolves against its ``cd``: servegate starts the
    service in the release checkout, where ``venvs/x/bin/python`` or ``./models/m`` would
    name something else (or nothing). A ``cd`` into the checkout itself changes nothing.
    A word counts as a path where it is the program or the activated environment (with a
    slash), starts with ``./`` or ``../``, or names something that exists under the
    ``cd`` directory on this box (``models/tiny``; a Hub id such as ``org/model`` that
    exists nowhere there stays a word)."""
    line, target = cd
    if target and os.path.realpath(target) == os.path.realpath(checkout):
        return
    for i, word in enumerate(words):
        value = word.literal.partition("=")[2] if word.literal.startswith("--") else word.literal
        if not value or value.startswith(("/", "-", "{")) or "/" not in value or "\n" in value:
            continue
        program = i == 0 or (i == 1 and words[0].literal.endswith("/"))
        if not (
            program
            or value.startswith(("./", "../"))
            or (target and os.path.exists(os.path.join(target, value)))
        ):
            continue
        where = os.path.join(target, value) if target else f"<the cd directory>/{value}"
        sh.n = line
        raise sh.refuse(
            f"`cd {target or '…'}`, then the relative path {value!r}: servegate starts the "
            "service in the release checkout, where it would name something else",
            hint=f"write it as an absolute path in the script ({where}), or cd into the "
            "checkout itself, then run init again",
        )


def _path_word(sh: _Shell, before: Word, word: Word) -> Word:
    """An argument written as a literal path of this box (``--model /models/qwen``,
    ``--download-dir=/data/hf``): a parameter named by its option (``model``,
    ``download_dir``; ``path`` without one), the script's value its default; a path in
    the checkout becomes ``{release}/…``. A word from a variable is the variable's."""
    if word.template != word.literal or word.splice:
        return word
    prefix, value = "", word.literal
    if value.startswith("--") and "=" in value:
        option, _, value = value.partition("=")
        prefix = option + "="
    else:
        option = before.literal if before.literal.startswith("--") else ""
    if not value.startswith("/") or "\n" in value:
        return word
    checkout = os.path.realpath(sh.checkout)
    if os.path.realpath(value) == checkout:
        return Word(word.literal, prefix + "{release}" + ("/" if value.endswith("/") else ""))
    if value.startswith(sh.checkout.rstrip("/") + "/"):
        return Word(word.literal, prefix + "{release}" + value[len(sh.checkout.rstrip("/")) :])
    name = re.sub(r"[^A-Za-z0-9_]", "_", option.lstrip("-")) or "path"
    return Word(word.literal, prefix + "{" + sh.param(name, value) + "}")


def _value(word: Word) -> Word:
    """The value of an assignment word."""
    n = len(word.assign) + 1
    return Word(word.literal[n:], word.template[n:])


def _splice(sh: _Shell, items: list[Word]) -> list[Word]:
    out: list[Word] = []
    for item in items:
        if not item.splice:
            out.append(Word(item.literal, item.template))
        elif item.splice in sh.arrays:
            out += sh.arrays[item.splice]
        else:
            raise sh.refuse(f"${{{item.splice}[@]}}: no array {item.splice} is set before this")
    return out


def _export(sh: _Shell, words: list[Word]) -> None:
    for w in words:
        if w.splice or w.items is not None or w.literal.startswith("-"):
            raise sh.refuse("export with options or arrays is not converted")
        if w.assign:
            sh.assign(w.assign, _value(w))
            sh.exported[w.assign] = sh.vars[w.assign]
        elif NAME.fullmatch(w.literal) and w.template == w.literal:
            if w.literal not in sh.vars:
                raise sh.refuse(f"export {w.literal}: it is never set in the script")
            sh.exported[w.literal] = sh.vars[w.literal]
        else:
            raise sh.refuse(f"export {w.literal!r}: not NAME or NAME=value (unquoted)")


def _port(result: Converted, argv: list[Word]) -> list[Word]:
    out = list(argv)
    for i, w in enumerate(out):
        nxt = out[i + 1].literal if i + 1 < len(out) else ""
        if w.literal == "--port" and re.fullmatch(r"[1-9][0-9]{0,4}", nxt):
            result.port = int(out[i + 1].literal)
            out[i + 1] = Word(out[i + 1].literal, "{port}")
        elif re.fullmatch(r"--port=[1-9][0-9]{0,4}", w.literal):
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
    """A TOML string, escaped by tomlkit (a control character such as DEL is not valid
    raw in TOML); a value with double quotes and no single ones is written literal, as
    a person would."""
    literal = '"' in value and "'" not in value and value.isprintable()
    return str(tomlkit.string(value, literal=literal).as_string())


def toml_key(key: str) -> str:
    """A TOML key: bare where it may be, quoted and escaped where not."""
    return str(tomlkit.key(key).as_string())


def toml_value(value: Any) -> str:
    """A string, bool, number or list of them as TOML (strings as :func:`_toml_str`)."""
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool | int | float):
        return str(tomlkit.item(value).as_string())
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
        lines += [f"{toml_key(k)} = {_toml_str(v)}" for k, v in c.params.items()]
        lines.append("")
    lines.append("[launch]")
    if c.module:
        lines += [f"interpreter = {_toml_str(c.interpreter)}", f"module = {_toml_str(c.module)}"]
    else:
        lines.append(f"executable = {_toml_str(c.executable)}")
    if c.positional:
        lines.append(f"positional = {toml_value(c.positional)}")
    lines += ['cwd = "{release}"', ""]
    if c.env:
        lines.append("[env]")
        lines += [f"{toml_key(k)} = {_toml_str(v)}" for k, v in c.env.items()]
        lines.append("")
    if c.args:
        lines.append("[args]")
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in c.args.items()]
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
