"""Reports what the kernel made of sockets created the ordinary Python way.

Used by the mptcpize tests: "report" prints JSON protocols of socket.socket()
variants, "dial HOST PORT" connects, exchanges a line and prints the protocol.
"""
import json
import socket
import sys


def proto(s):
    return s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)


def main():
    if sys.argv[1] == "report":
        out = {}
        with socket.socket() as s:
            out["tcp4"] = proto(s)
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            out["tcp6"] = proto(s)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            out["udp4"] = proto(s)
        a, b = socket.socketpair()
        a.sendall(b"x")
        out["unix_pair_ok"] = b.recv(1) == b"x"
        a.close()
        b.close()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            out["unix_stream_family"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        print(json.dumps(out), flush=True)
    elif sys.argv[1] == "dial":
        s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=5)
        s.sendall(b"ping\n")
        reply = s.makefile().readline()
        print(json.dumps({"proto": proto(s), "reply": reply}), flush=True)
        s.close()
    elif sys.argv[1] == "serve":
        # A plain TCP server, started without mpdetour run: the non-MPTCP peer.
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((sys.argv[2], int(sys.argv[3])))
        ls.listen()
        print("listening %d" % proto(ls), flush=True)
        c, _ = ls.accept()
        c.makefile().readline()
        c.sendall(b"pong %d\n" % proto(c))
        c.close()
    else:
        sys.exit(2)


if __name__ == "__main__":
    main()
