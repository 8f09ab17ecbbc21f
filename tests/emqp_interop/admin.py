"""eventmq's own ``emq-cli`` against an admin port: ``python admin.py ADDR COMMAND...``.

The installed ``emq-cli`` script's Shell connects (sending HELLO, as at its prompt) and runs
each command as typed at its prompt (``status``, ``show_workers``, ``show_schedulers``). What
it prints is read back (it pprints the decoded reply, or ``None`` when none came in its
one-second wait) and given as one JSON line per command: the number of frames of the reply
it read (None: none) and the printed value."""

import ast
import contextlib
import io
import json
import os
import runpy
import sys

os.environ.setdefault("EVENTMQ_CONFIG_FILE", os.devnull)

address, commands = sys.argv[1], sys.argv[2:]
emq_cli = runpy.run_path(os.path.join(os.path.dirname(sys.executable), "emq-cli"))
with contextlib.redirect_stdout(sys.stderr):  # its "Connecting to ..." line
    shell = emq_cli["Shell"](addr=address)
received = []
read = shell.socket.recv_multipart


def recording():
    frames = read()
    received.append(len(frames))
    return frames


shell.socket.recv_multipart = recording
for command in commands:
    before = len(received)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        shell.onecmd(command)
    frames = received[before] if len(received) > before else None
    value = ast.literal_eval(printed.getvalue().strip())
    print(json.dumps({"command": command, "frames": frames, "value": value}), flush=True)
shell.socket.zsocket.close(linger=0)
