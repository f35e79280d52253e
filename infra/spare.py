"""A warm spare of a Bytewax job: imported ahead, started when its job's process dies.

    python -m infra.spare -m bytewax.run FLOW ARGS...    (the job's own argv after `python`)

A restarted job spends most of its start importing (Python, Bytewax, the flow's modules:
~1.3 s on an idle 2-core machine, over 2 s on a busy one), and while the transactional plan or
dispatch job restarts, every OTP waits. The supervisor (infra/stack.py) keeps one spare per job
listed in `infra/services.py` `SPARES`: this process imports `bytewax.run` and the flow's module,
then blocks reading its stdin. When the job's process dies the supervisor writes one line to
the spare's stdin and the spare becomes the job, exactly as `python -m bytewax.run FLOW ARGS`
(same environment, same log, its recovery directory: it resumes from the last snapshot); the
supervisor then starts the next spare. While it waits the spare holds no port, no file and no
connection, and uses no CPU. End of input without a line (the supervisor went away) exits.
"""

from __future__ import annotations

import importlib
import runpy
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "-m":
        print("usage: python -m infra.spare -m MODULE FLOW [ARGS...]", file=sys.stderr)
        return 2
    module, rest = argv[1], argv[2:]
    importlib.import_module(module)
    if ":" in rest[0]:  # a Bytewax flow, e.g. dataflows.plan:build_flow(...): its module too
        importlib.import_module(rest[0].split(":", 1)[0])
    if not sys.stdin.readline():
        return 0  # never needed
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
