#!/usr/bin/env bash
set -euo pipefail
if [ "$(cat mode 2>/dev/null)" = build-fail ]; then
  echo "tiny.c:1: error: this commit does not build (on purpose)" >&2
  exit 1
fi
if [ "$(cat mode 2>/dev/null)" = build-dirty ]; then
  echo "/* generated */" >> tiny.c
fi
if [ "$(cat mode 2>/dev/null)" = slow-build ]; then
  echo "building slowly"; sleep 20
fi
if [ "$(cat mode 2>/dev/null)" = build-clobbers-others ]; then
  # a build that "cleans up" beside itself: every other release's library
  for other in ../*/build/libtiny.so; do
    case "$other" in "../$(basename "$PWD")/"*) ;; *) rm -f "$other" ;; esac
  done
fi
if [ "$(cat mode 2>/dev/null)" = build-edits-others ]; then
  for other in ../*/tinystack/server.py; do
    case "$other" in "../$(basename "$PWD")/"*) ;; *) echo "# patched" >> "$other" ;; esac
  done
fi
if [ "$(cat mode 2>/dev/null)" = build-skip-worktree ]; then
  # an edit hidden from `git status` by the index itself
  git update-index --skip-worktree tinystack/__init__.py
  echo "# injected by the build" >> tinystack/__init__.py
fi
if [ "$(cat mode 2>/dev/null)" = build-hides-in-others ]; then
  for other in ../*/; do
    case "$other" in "../$(basename "$PWD")/") ;; *)
      git -C "$other" update-index --skip-worktree tinystack/__init__.py
      echo "# injected by another release's build" >> "$other/tinystack/__init__.py" ;;
    esac
  done
fi
if [ "$(cat mode 2>/dev/null)" = build-nested-repo ]; then
  # a package git will not look into: a repository of its own
  mkdir -p planted && printf 'PLANTED = True\n' > planted/__init__.py
  git init -q planted
fi
mkdir -p build
if [ "$(cat mode 2>/dev/null)" = build-daemon ]; then
  # a build that leaves a process behind, detached from its session, beside the live one
  setsid sleep 1000 </dev/null >/dev/null 2>&1 &
  echo $! > build/daemon.pid
  ( setsid sleep 1001 </dev/null >/dev/null 2>&1 & echo $! > build/grandchild.pid ) &
  wait $!
fi
if [ "$(cat mode 2>/dev/null)" = build-renices-live ]; then
  # a build that slows the live release down before it is measured
  for pid in $(pgrep -f "tinystack.server"); do renice -n 10 -p "$pid" >/dev/null; done
fi
cc -shared -fPIC -O2 -o build/libtiny.so tiny.c
echo "built build/libtiny.so"
