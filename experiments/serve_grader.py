"""Serves the project's LM grader behind an OpenAI-compatible chat-completions API.

    python experiments/serve_grader.py --grader=assets/lm_grader --port=8000
    # then grade through it (or point any OpenAI client at it):
    python experiments/train.py --config=configs/gagar.py:grader=openai \\
        --config.grader.openai.base_url=http://127.0.0.1:8000/v1 --workdir=runs/gagar_http

Loopback by default (--host). --port=0 picks a free port; the first line printed is
`serving <model> on http://HOST:PORT/v1`. With --api_key (or $GAGAR_GRADER_API_KEY)
requests must send `Authorization: Bearer <key>`.
"""

import os

from absl import flags, logging

from gagar_jax import cli
from gagar_jax.grading import lm_grader, server

_GRADER = flags.DEFINE_string("grader", "assets/lm_grader", "A grader folder (sft.py --export).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Interface to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "Port (0: any free port).")
_MODEL = flags.DEFINE_string("model_name", "gagar-lm-grader", "The model id clients ask for.")
_KEY = flags.DEFINE_string("api_key", "", "Required bearer key ('' -> $GAGAR_GRADER_API_KEY).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Log every request.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 8, "Requests batched into one device call.")
_READ_TIMEOUT = flags.DEFINE_float(
  "read_timeout_s", server.READ_TIMEOUT_S, "A client silent this long mid-request is dropped."
)
_MAX_PENDING = flags.DEFINE_integer(
  "max_pending", 32, "Requests that may wait for the model; past that: 503 + Retry-After."
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  chat = lm_grader.load_chat_model(_GRADER.value, max_batch=_MAX_BATCH.value, field="grader")
  key = _KEY.value or os.environ.get("GAGAR_GRADER_API_KEY", "")
  httpd = server.make_server(
    chat,
    _HOST.value,
    _PORT.value,
    model_name=_MODEL.value,
    api_key=key,
    verbose=_VERBOSE.value,
    max_pending=_MAX_PENDING.value,
    read_timeout_s=_READ_TIMEOUT.value,
  )
  host, port = httpd.server_address[:2]
  print(f"serving {_MODEL.value} on http://{host}:{port}/v1", flush=True)
  try:
    httpd.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    httpd.server_close()


if __name__ == "__main__":
  cli.run(main)
