"""llama.cpp's converter imported once, then forked per conversion (run by tests/models/converted.py).

Importing the converter (torch, transformers, its bundled gguf-py, its `conversion` package) costs more
CPU than converting a tiny model, and the tests convert over a dozen. Each conversion runs in a fresh fork
of this process, so nothing one conversion changes (the converter sets class attributes for --no-mtp)
reaches the next: the same as running the script once per file.

Protocol: argv[1] is the converter's folder; each stdin line is a JSON list of the converter's arguments,
answered by one stdout line, a JSON object {"code": exit status, "log": the conversion's output}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback


def convert_in_fork(main, args: list[str]) -> tuple[int, str]:
    with tempfile.TemporaryFile("w+") as log:
        pid = os.fork()
        if pid == 0:  # the child: the script's own run, its output to the log
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            sys.argv = ["convert_hf_to_gguf.py", *args]
            code = 0
            try:
                main()
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        log.seek(0)
        return os.waitstatus_to_exitcode(status), log.read()


def serve(folder: str) -> None:
    sys.path.insert(0, folder)
    import convert_hf_to_gguf  # the script as a module: its main() is not run on import

    for line in sys.stdin:
        code, log = convert_in_fork(convert_hf_to_gguf.main, json.loads(line))
        print(json.dumps({"code": code, "log": log}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
