"""Provenance: proof that the live service runs the release checkout, one module per
kind of evidence.

- :mod:`~servegate.provenance.check` runs the checks on the live process tree and says
  what they found (the ``provenance`` stage of a promote, ``release verify``);
- :mod:`~servegate.provenance.liveproc`: the process tree as ``/proc`` shows it (argv,
  cwd, executable, environment, maps, cgroup), the types every check shares;
- :mod:`~servegate.provenance.codeorigin`: where the code each process runs came from
  (imported files, mapped libraries, cached bytecode) against the release's tracked files;
- :mod:`~servegate.provenance.frames`: the frames each Python process is running, read
  with py-spy;
- :mod:`~servegate.provenance.startup_hooks`: the ``.pth`` files and modules a site
  directory runs at interpreter start.
"""
