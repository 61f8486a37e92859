"""Launch scripts a team might write, attacked: ``servegate init`` either converts one
into a profile that renders exactly what bash execs (argv and exported environment,
word for word), or refuses it with the line — never a silent difference."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from servegate.engine import profiles, shellimport
from servegate.errors import ConfigError

CHECKOUT = "/srv/stack"
HEAD = f"repo={CHECKOUT}\nPY=/opt/venv/bin/python\n"


def bash_exec(script: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """What bash itself would exec: ``exec`` and ``cd`` replaced, nothing else run."""
    wrapper = (
        'exec() { printf \'%s\\0\' "$@" > "$ARGV_OUT"; env -0 > "$ENV_OUT"; builtin exit 0; }\n'
        "cd() { :; }\n" + script
    )
    subprocess.run(
        ["env", "-i", f"ARGV_OUT={tmp}/argv", f"ENV_OUT={tmp}/env", "bash", "-c", wrapper],
        check=True,
    )
    argv = (tmp / "argv").read_bytes().decode().split("\0")[:-1]
    env = dict(p.split("=", 1) for p in (tmp / "env").read_bytes().decode().split("\0")[:-1])
    for noise in ("PWD", "SHLVL", "_", "ARGV_OUT", "ENV_OUT", "OLDPWD"):
        env.pop(noise, None)
    if argv and argv[0] == "env":  # `exec env A=1 cmd`: env(1) execs cmd with A=1
        argv = argv[1:]
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            name, value = argv.pop(0).split("=", 1)
            env[name] = value
    return argv, env


def rendered(conv: shellimport.Converted, tmp: Path) -> tuple[list[str], dict[str, str]]:
    path = tmp / "launch.toml"
    path.write_text(shellimport.profile_toml(conv, "launch.sh"))
    builtins = {"release": CHECKOUT, "port": str(conv.port or 8000), "sha": "0" * 40,
                "short": "0" * 12, "host_root": "/h"}  # fmt: skip
    r = profiles.resolve(profiles.load(str(path)), {}, builtins)
    return list(r.argv), dict(r.env)


CONVERTED = {
    "single-dash options": 'exec "$PY" -u -X dev -m vllm --port 8080 -tp 4',
    "exec env": 'exec env FOO=1 BAR="a b" "$PY" -m vllm --port 8080',
    "assignment before exec": 'FOO=1 exec "$PY" -m vllm --port 8080',
    "hash inside a word": 'exec "$PY" -m vllm --api-key abc#123 --tp 2  # a comment',
    "repeated options": 'exec "$PY" -m vllm --x a --y b --x c --port 8080',
    "key=value": 'exec "$PY" -m vllm --model=/m --port=8080',
    "single quotes keep $": "X=5\nexport LIT='$X $X'\nexec \"$PY\" -m vllm --t '$X'",
    "escaped dollar": 'X=5\nexec "$PY" -m vllm --a \\$X --b "\\$X"',
    "value at the time of use": (
        'M=/a\nexport X=$M\nargs=(--model "$M")\nM=/b\nexport Y=$M\nexec "$PY" -m vllm "${args[@]}"'
    ),
    "self-appending variables": (
        'export NCCL_FLAGS=a\nexport NCCL_FLAGS="$NCCL_FLAGS,b"\n'
        "export LD_LIBRARY_PATH=/opt/cuda/lib\n"
        'export LD_LIBRARY_PATH=/opt/x:$LD_LIBRARY_PATH\nexec "$PY" -m vllm'
    ),
    "export of set names": 'A=1\nB=2\nexport A B\nHF_HOME=/data/hf\nexport HF_HOME\nexec "$PY" -m v',
    "a variable named port": 'port=9000\nexec "$PY" -m vllm --port "$port"',
    "the first exec wins": 'exec "$PY" -m vllm --tp 1\nexec "$PY" -m vllm --tp 2\nexport LATE=1',
    "json and numbers as written": (
        'exec "$PY" -m vllm --cc \'{"level": 3, "x": 1e3}\' --gpu 007 --x -0 --n é'
    ),
    "a paren inside a quoted array word": (
        'args=(\n  --chat-template "tmpl(x)"  # (a comment)\n  --tp 2\n)\nexec "$PY" -m v "${args[@]}"'
    ),
    "checkout with a slash": 'exec "$PY" -m vllm --download-dir "$repo/" --root "$repo"',
    "wrappers": 'exec numactl --cpunodebind=0 --membind=0 "$PY" -m vllm --port 8080',
    # from a second attack: comments never continue, quoted globs stay words
    "a comment ending in a backslash": (
        '# note \\\nexport A=1  # more \\\nexport B=2\nexec "$PY" -m vllm'
    ),
    "a quoted glob": 'G=\'*.py\'\nexec "$PY" -m vllm --x "$G" --y \'a{b,c}\' --z "~/m"',
    "an odd port": 'exec "$PY" -m vllm --port ²',
    "continuations between words": 'exec "$PY" -m vllm \\\n  --tp 2 \\\n  --pp 1',
}


@pytest.mark.parametrize("body", CONVERTED.values(), ids=list(CONVERTED))
def test_what_is_converted_renders_what_bash_execs(body: str, tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    script = HEAD + body + "\n"
    conv = shellimport.convert(script, Path(CHECKOUT))
    argv, env = bash_exec(script, tmp_path)
    assert (conv.argv, conv.environ) == (argv, env)
    assert rendered(conv, tmp_path) == (argv, env)


REFUSED = {
    "redirection": ('exec "$PY" -m vllm --port 8080 >> /var/log/v.log 2>&1', "redirection"),
    "pipe": ('"$PY" -m vllm 2>&1 | tee /tmp/log', "pipe"),
    "background": ('"$PY" -m vllm &\nwait', "pipe"),
    "a chain": ('cd "$repo" && exec "$PY" -m vllm', "chained"),
    "default expansion": ('exec "$PY" -m vllm --tp "${TP:-4}"', "only $NAME"),
    "command substitution": ('N=$(nproc)\nexec "$PY" -m vllm', "only $NAME"),
    "backticks": ('N=`nproc`\nexec "$PY" -m vllm', "unquoted '`'"),
    "positional parameter": ('exec "$PY" -m vllm "$1"', "only $NAME"),
    "tilde": ('exec "$PY" -m vllm --model ~/models/m', "~"),
    "unset variable": ('exec "$PY" -m vllm --model "$HOME/m"', "$HOME is never set"),
    "word splitting": ('OPTS="--tp 4"\nexec "$PY" -m vllm $OPTS', "holds spaces"),
    "array append": (
        'args=(--tp 1)\nargs+=(--eager)\nexec "$PY" -m v "${args[@]}"',
        "unquoted '('",
    ),
    "conditional": ('if [ -d / ]; then export A=1; fi\nexec "$PY" -m v', "unquoted '['"),
    "declare": ('declare -x FOO=bar\nexec "$PY" -m v', "`declare`"),
    "unset": ('export FOO=1\nunset FOO\nexec "$PY" -m v', "`unset`"),
    "source": ('source ./env.sh\nexec "$PY" -m v', "`source ./env.sh`"),
    "dot": ('. ./env.sh\nexec "$PY" -m v', "`. ./env.sh`"),
    "conda activate": ("conda activate vllm\nexec python -m v", "`conda activate vllm`"),
    "heredoc": ('cat > /tmp/x <<EOF\nexport FOO=1\nEOF\nexec "$PY" -m v', "redirection"),
    "function": ('start() {\n  exec "$PY" -m v\n}\nstart', "straight-line"),
    "exec options": ('exec -a vllm "$PY" -m v', "exec's own options"),
    "a literal placeholder": ("exec \"$PY\" -m vllm --name '{port}' --port 8080", "would not run"),
    "literal braces": ("export FMT='${X}'\nexec \"$PY\" -m vllm", "unknown placeholder"),
    # from a second attack: what bash reads differently from plain text
    "CR line endings": ('exec "$PY" -m vllm --port 8080\r', "CR line ending"),
    "a control character": ('exec "$PY" -m vllm --x a\x1cb', "control character"),
    "a newline in single quotes": ("export A='x\\\ny'\nexec \"$PY\" -m v", "inside quotes"),
    "a glob": ('exec "$PY" -m vllm --x *.py', "unquoted '*'"),
    "a glob in a variable": ("G='*.py'\nexec \"$PY\" -m vllm --x $G", "glob characters"),
    "brace expansion": ('exec "$PY" -m vllm --x a{b,c}', "unquoted '{'"),
    "tilde after =": ('export P=/a:~/x\nexec "$PY" -m v', "unquoted '~'"),
    "an empty unquoted variable": ('E=""\nexec "$PY" -m vllm $E --x', "is empty"),
    "an unquoted splice": ('args=("a b")\nexec "$PY" -m v ${args[@]}', "only $NAME"),
    "IFS": ('IFS=,\nexec "$PY" -m v', "IFS= changes"),
    "set -a": ('set -a\nA=1\nexec "$PY" -m v', "`set`"),
    "printf -v": ('export A=1\nprintf -v A %s x\nexec "$PY" -m v', "`printf`"),
    "assigning default": ('export A=""\n: ${A:=5}\nexec "$PY" -m v', "could change a variable"),
    "arithmetic": ('export A=1\ntest $((A=5))\nexec "$PY" -m v', "could change a variable"),
    "let": ('export A=1\nlet A=5\nexec "$PY" -m v', "`let`"),
    "append assignment": ('export A=a\nA+=b\nexec "$PY" -m v', "`A+=b`"),
    "builtin": ('builtin export A=1\nexec "$PY" -m v', "`builtin`"),
    "time": ('time exec "$PY" -m v', "`time`"),
    "an array on an exported name": ('export A=1\nA=(x y)\nexec "$PY" -m v', "exported"),
    "a quoted assignment": ('A"=1"\nexport A\nexec "$PY" -m v', "`A=1`"),
    "a quoted prefix": ('"A"=1 exec "$PY" -m v', "`A=1`"),
    "env with an odd name": ('exec env 1A=x "$PY" -m v', "not NAME=value"),
    "an unterminated splice": ('args=(a)\nexec "$PY" -m v "${args[@]}', "only $NAME"),
    # from a third attack: skipped commands that bash still expands, bash's own variables
    "lines hidden in backticks": ('export A=1\n: `\nexport B=2\n: `\nexec "$PY" -m v', "close"),
    "lines hidden in $(": (': $(\nexport B=2\n: )\nexec "$PY" -m v', "close"),
    "old arithmetic": ('export A=1\n: $[A=5]\nexec "$PY" -m v', "could change a variable"),
    "a subscript": ('export A=1\n: ${X[A--]}\nexec "$PY" -m v', "could change a variable"),
    "test -v": ("export A=1\ntest -v 'X[A=5]'\nexec \"$PY\" -m v", "test -v"),
    "indirection": ('P=\'X[A=5]\'\n: "${!P}"\nexec "$PY" -m v', "could change a variable"),
    "PS4 and set -x": ("PS4='$((A=5))'\nset -x\nexec \"$PY\" -m v", "PS4= changes"),
    "set -x": ('set -x\nexec "$PY" -m v', "`set`"),
    "$_": ('_=a\n: b\nexec "$PY" -m v --x "$_"', "_= changes"),
    "LINENO": ('LINENO=1\nexec "$PY" -m v --x "$LINENO"', "LINENO= changes"),
    "RANDOM": ('RANDOM=1\nexec "$PY" -m v --x "$RANDOM"', "RANDOM= changes"),
    "UID": ('UID=5\nexport UID\nexec "$PY" -m v', "UID= changes"),
    "EPOCHSECONDS": ('export EPOCHSECONDS=5\nexec "$PY" -m v', "EPOCHSECONDS= changes"),
    "an empty exec": ('args=()\nexec "${args[@]}"', "exec without a command"),
    "exec options in an array": ('args=(-a name)\nexec "${args[@]}" "$PY" -m v', "exec's own"),
    "an invalid character": ('exec "$PY" -m v --x a\udcffb', "invalid character"),
    "two launch candidates": ('"$PY" check.py\n"$PY" -m vllm', "could be it"),
}


def _convert_and_write(script: str) -> str:
    return shellimport.profile_toml(shellimport.convert(script, Path(CHECKOUT)), "launch.sh")


@pytest.mark.parametrize(("body", "why"), REFUSED.values(), ids=list(REFUSED))
def test_what_is_not_modelled_is_refused_with_its_line(body: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _convert_and_write(HEAD + body + "\n")
    assert why in str(caught.value) + str(caught.value.hint or "")


@pytest.mark.parametrize("activate", ["source", "."])
def test_a_virtualenv_activation_gives_the_interpreter_its_path(
    activate: str, tmp_path: Path
) -> None:
    """Teams write `source /opt/venvs/vllm/bin/activate` and then `exec python -m …`:
    the interpreter is that environment's, by its path."""
    venv = tmp_path / "venvs" / "vllm"
    script = (
        f"#!/usr/bin/env bash\n{activate} {venv}/bin/activate\ncd /srv/stack\n"
        "exec python -m vllm.entrypoints.openai.api_server --port 8080\n"
    )
    conv = shellimport.convert(script, Path(CHECKOUT))
    assert conv.argv[0] == f"{venv}/bin/python"
    assert conv.interpreter == f"{venv}/bin/python"
    assert any("a virtualenv" in line for line in conv.skipped)


def test_literal_paths_of_the_box_become_parameters_named_by_their_option(
    tmp_path: Path,
) -> None:
    """Paths written out in the exec line (the model, a download directory, a file in
    the checkout) are the box's, not the release's: each other box sets its own. They
    become parameters named by their option with the script's value as the default, a
    path in the checkout becomes {release}/…, and the profile renders what bash execs."""
    script = HEAD + (
        'exec "$PY" -m vllm.entrypoints.openai.api_server --model /models/qwen3 '
        "--download-dir=/data/hf --chat-template /srv/stack/tmpl/chat.jinja "
        "--served-model-name qwen --tokenizer /models/qwen3\n"
    )
    conv = shellimport.convert(script, Path(CHECKOUT))
    assert conv.params == {"PY": "/opt/venv/bin/python", "model": "/models/qwen3",
                           "download_dir": "/data/hf", "tokenizer": "/models/qwen3"}  # fmt: skip
    text = shellimport.profile_toml(conv, "launch.sh")
    assert '"{model}"' in text
    assert '"--download-dir={download_dir}"' in text
    assert '"{release}/tmpl/chat.jinja"' in text
    if shutil.which("bash") is not None:
        assert rendered(conv, tmp_path) == bash_exec(script, tmp_path)
    path = tmp_path / "launch.toml"
    path.write_text(text)
    other = profiles.resolve(profiles.load(str(path)), {"model": "/big/disk/qwen3"},
                             {"release": "/r", "port": "1", "sha": "0" * 40, "short": "0",
                              "host_root": "/h"})  # fmt: skip
    assert "/big/disk/qwen3" in other.argv
    assert "/r/tmpl/chat.jinja" in other.argv


def test_what_cannot_be_resolved_says_exactly_what_to_write() -> None:
    with pytest.raises(ConfigError) as conda:
        shellimport.convert("conda activate vllm\nexec python -m v\n", Path(CHECKOUT))
    assert "exec /opt/conda/envs/vllm/bin/python -m" in conda.value.hint
    with pytest.raises(ConfigError) as sourced:
        shellimport.convert("source ./env.sh\nexec python -m v\n", Path(CHECKOUT))
    assert "export NAME=value" in sourced.value.hint


@pytest.mark.parametrize(
    "value", ["a\x7fb", 'say "hi"', "it's", "two\nlines", "tab\there", "é\u2028", "C:\\x", ""]
)
def test_every_string_is_written_as_the_toml_that_reads_it_back(value: str) -> None:
    """A value of a script (or of init's answers) becomes TOML that reads back as
    itself, a control character such as DEL included (raw, it is invalid TOML)."""
    import tomllib

    text = f"{shellimport.toml_key(value or 'k')} = {shellimport.toml_value([value, value])}"
    assert tomllib.loads(text) == {value or "k": [value, value]}


def test_a_relative_path_after_a_cd_elsewhere_is_refused_with_its_absolute_form(
    tmp_path: Path,
) -> None:
    """`cd /srv/sb; source venvs/x/bin/activate; exec python … --model models/tiny`: the
    service starts in the release checkout, where those words name something else."""
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    venv = f"cd {tmp_path}\nsource venvs/x/bin/activate\nexec python -m vllm --port 8000\n"
    with pytest.raises(ConfigError, match="venvs/x/bin/") as err:
        shellimport.convert("#!/usr/bin/env bash\n" + venv, Path(CHECKOUT))
    assert f"{tmp_path}/venvs/x/bin/" in err.value.hint
    assert "line 2:" in str(err.value)
    model = f"cd {tmp_path}\nexec /opt/py/bin/python -m vllm --model models/tiny\n"
    with pytest.raises(ConfigError, match="models/tiny"):
        shellimport.convert("#!/usr/bin/env bash\n" + model, Path(CHECKOUT))
    dotted = f"cd {tmp_path}\nexec /opt/py/bin/python -m vllm --chat-template=./t.jinja\n"
    with pytest.raises(ConfigError, match=r"\./t\.jinja"):
        shellimport.convert("#!/usr/bin/env bash\n" + dotted, Path(CHECKOUT))
    # a Hub id that names nothing there stays a word; a cd into the checkout changes nothing
    hub = f"cd {tmp_path}\nexec /opt/py/bin/python -m vllm --model Qwen/Qwen3-8B\n"
    assert shellimport.convert("#!/usr/bin/env bash\n" + hub, Path(CHECKOUT)).argv[-1] == (
        "Qwen/Qwen3-8B"
    )
    home = f"cd {CHECKOUT}\nsource venvs/x/bin/activate\nexec python -m vllm\n"
    conv = shellimport.convert("#!/usr/bin/env bash\n" + home, Path(CHECKOUT))
    assert conv.argv[0] == "venvs/x/bin/python"
