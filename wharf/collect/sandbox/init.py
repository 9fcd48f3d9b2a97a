"""The init (pid 1) of a trial's sandbox: reaps orphans and forwards the model route.

Run inside the sandbox as `python -c <this file's text> [PORT=SOCKET ...]`, stdlib only (the
project's source is not visible in the sandbox). As pid 1 of its pid namespace it cannot be
killed from inside (the kernel drops SIGKILL sent to a namespace's init by its members), so an
agent can neither end its sandbox early nor replace the forwarder.

Each PORT=SOCKET pair: listen on 127.0.0.1:PORT in the sandbox's own network namespace (whose
only interface is loopback) and pipe every connection to the Unix socket SOCKET, bound in from
the host. That socket is the sandbox's only way out.
"""
import os
import signal
import socket
import sys
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def listen(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(128)
    return srv


def serve(srv, path):
    while True:
        conn, _ = srv.accept()
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            continue
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()


def reap():
    # SIGCHLD blocked so it queues (a namespace's init drops signals it has no handler for):
    # an orphan that dies is reaped at once, not left a zombie.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.sigtimedwait([signal.SIGCHLD], 1.0)


signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # before any thread starts
for arg in sys.argv[1:]:
    port, path = arg.split("=", 1)
    threading.Thread(target=serve, args=(listen(int(port)), path), daemon=True).start()
sys.stdout.write("ready\n")
sys.stdout.flush()
reap()
