"""A stand-in for `armorlab vllm-serve --model M --port P --host H [args]`: answers GET /health with
200 and records how it was started, for tests of the job's server orchestration (no vLLM, no torch).

It writes ``$STANDIN_SERVER_DIR/<port>-<pid>.json``: argv, pid, CUDA_VISIBLE_DEVICES, whether SIGTERM is
blocked and SIGUSR2 ignored (the job's shield), and later how it stopped. ``STANDIN_SERVER_MODE``:
``""`` serve; ``fail`` print an error and exit 3 before listening; ``hang`` never listen;
``die-after:S`` serve, then exit 1 after S seconds; ``ready-after:S`` listen only after S seconds.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import time
from pathlib import Path


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", required=True)
    args, _ = parser.parse_known_args()
    path = Path(os.environ["STANDIN_SERVER_DIR"]) / f"{args.port}-{os.getpid()}.json"
    record = {"argv": sys.argv[1:], "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "sigterm_blocked": signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []),
              "usr2_ignored": signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN,
              "endpoints_env": os.environ.get("ARMORLAB_VLLM_ENDPOINTS"), "stopped": None}

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    save()
    print(f"stand-in server for {args.model} on port {args.port}", flush=True)
    mode = os.environ.get("STANDIN_SERVER_MODE", "")
    try:
        if mode == "fail":
            print("ValueError: cannot load the model (stand-in failure)", flush=True)
            return 3
        if mode == "hang":
            while True:
                time.sleep(1)
        if mode.startswith("ready-after:"):
            time.sleep(float(mode.split(":")[1]))
        server = http.server.ThreadingHTTPServer((args.host, args.port), Health)
        if mode.startswith("die-after:"):
            def die(*_):
                print("RuntimeError: engine core died (stand-in)", flush=True)
                os._exit(1)

            signal.signal(signal.SIGALRM, die)
            signal.setitimer(signal.ITIMER_REAL, float(mode.split(":")[1]))
        server.serve_forever()
    except KeyboardInterrupt:  # SIGINT: the job's graceful stop
        record["stopped"] = "SIGINT"
        save()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
